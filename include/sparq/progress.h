// A one-line progress bar with ETA on stderr; silent when stderr is not a terminal (logs, CI).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace sparq {

class ProgressBar {
 public:
  // total: number of steps; label: printed before the bar.
  ProgressBar(std::string label, int64_t total);
  ~ProgressBar();  // ends the line if anything was drawn
  void Update(int64_t done, const std::string& note = "");
  bool enabled() const { return enabled_; }

 private:
  std::string label_;
  int64_t total_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace sparq
