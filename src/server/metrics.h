// Prometheus metrics of the server (GET /metrics, text exposition format 0.0.4): requests by
// endpoint and status, prompt / cached / generated tokens, time to first token and time per
// output token (histograms), and the scheduler's gauges (running, queued, state memory in use,
// prefix cache) sampled at scrape time.
#pragma once

#include <array>
#include <map>
#include <mutex>
#include <string>

#include "engine/scheduler.h"

namespace dsv4::server {

class Histogram {
 public:
  void observe(double seconds);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  static constexpr std::array<double, 14> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                     0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};
  std::array<uint64_t, kBounds.size()> counts_{};
  uint64_t count_ = 0;
  double sum_ = 0;
};

class Metrics {
 public:
  void count_request(const std::string& endpoint, int status);
  void count_tokens(int64_t prompt, int64_t cached, int64_t generated);
  void observe_ttft(double seconds);
  void observe_tpot(double seconds);
  std::string render(const engine::SchedulerStats& stats) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, cached_tokens_ = 0, generated_tokens_ = 0;
  Histogram ttft_, tpot_;
};

}  // namespace dsv4::server
