#include "server/metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>

namespace dsv4::server {

void Histogram::observe(double seconds) {
  for (size_t i = 0; i < kBounds.size(); ++i)
    if (seconds <= kBounds[i]) ++counts_[i];
  ++count_;
  sum_ += seconds;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  for (size_t i = 0; i < kBounds.size(); ++i) out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kBounds[i], counts_[i]);
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mutex_);
  ++requests_[{endpoint, status}];
}

void Metrics::count_tokens(int64_t prompt, int64_t cached, int64_t generated) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += uint64_t(prompt);
  cached_tokens_ += uint64_t(cached);
  generated_tokens_ += uint64_t(generated);
}

void Metrics::observe_ttft(double seconds) {
  std::lock_guard lock(mutex_);
  ttft_.observe(seconds);
}

void Metrics::observe_tpot(double seconds) {
  std::lock_guard lock(mutex_);
  tpot_.observe(seconds);
}

namespace {

// The process's resident memory, so a load test can see it return to its baseline.
size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return pages_resident * size_t(sysconf(_SC_PAGESIZE));
}

void gauge(std::string& out, const std::string& name, const std::string& help, double value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, value);
}

void counter(std::string& out, const std::string& name, const std::string& help, uint64_t value) {
  out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, value);
}

}  // namespace

std::string Metrics::render(const engine::SchedulerStats& stats) const {
  std::lock_guard lock(mutex_);
  std::string out;
  out += "# HELP dsv4_requests_total HTTP requests by endpoint and status.\n# TYPE dsv4_requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += fmt::format("dsv4_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", key.first, key.second, n);
  counter(out, "dsv4_prompt_tokens_total", "Prompt tokens of finished requests.", prompt_tokens_);
  counter(out, "dsv4_cached_prompt_tokens_total", "Prompt tokens restored from the prefix cache.", cached_tokens_);
  counter(out, "dsv4_generation_tokens_total", "Generated tokens.", generated_tokens_);
  ttft_.render(out, "dsv4_time_to_first_token_seconds", "From request arrival to its first generated token.");
  tpot_.render(out, "dsv4_time_per_output_token_seconds", "Mean time between tokens after the first, per request.");
  gauge(out, "dsv4_running_sequences", "Sequences admitted and holding state.", double(stats.running));
  gauge(out, "dsv4_queued_requests", "Requests waiting for admission.", double(stats.queued));
  gauge(out, "dsv4_parked_sequences", "Preempted sequences whose state waits in a file.", double(stats.parked));
  counter(out, "dsv4_preemptions_total", "Sequences parked to make room for waiting requests.", stats.preemptions);
  counter(out, "dsv4_draft_tokens_total", "Speculative draft tokens fed (serve --speculative).", stats.drafted);
  counter(out, "dsv4_draft_tokens_accepted_total", "Of them, the ones sampling then chose.", stats.accepted);
  gauge(out, "dsv4_sequence_state_bytes", "Memory held by live sequences' state.", double(stats.state_bytes));
  gauge(out, "dsv4_reserved_state_bytes", "State memory reserved by admission for live sequences.",
        double(stats.reserved_bytes));
  gauge(out, "dsv4_prefix_cache_bytes", "Memory held by prefix-cache snapshots.", double(stats.prefix_cache_bytes));
  gauge(out, "dsv4_prefix_cache_entries", "Prefix-cache snapshots.", double(stats.prefix_cache_entries));
  gauge(out, "dsv4_process_resident_bytes", "Resident memory of the server process.", double(resident_bytes()));
  return out;
}

}  // namespace dsv4::server
