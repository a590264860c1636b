// A step's device work recorded and launched in a few parts where the backend can
// (Backend::begin_capture): made before the step's first op; flush() between parts (sublayers),
// so the device runs one while the host records the next; run() after the last op, before the
// step's results are read. If the step throws in between, the part being recorded is dropped.
#pragma once

#include <cstdint>

#include "backend/backend.h"

namespace dsv4::engine {

class CapturedStep {
 public:
  // allowed: false when something must be read back in the middle (a tracer).
  CapturedStep(Backend& backend, int64_t rows, bool allowed)
      : backend_(backend), active_(allowed && backend.begin_capture(rows)) {}
  ~CapturedStep() {
    if (active_) backend_.end_capture(false);
  }
  CapturedStep(const CapturedStep&) = delete;
  CapturedStep& operator=(const CapturedStep&) = delete;
  void flush() {
    if (active_) backend_.flush_capture();
  }
  void run() {
    if (!active_) return;
    active_ = false;
    backend_.end_capture(true);
  }

 private:
  Backend& backend_;
  bool active_;
};

}  // namespace dsv4::engine
