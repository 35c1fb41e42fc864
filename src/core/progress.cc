#include "sparq/progress.h"

#include <unistd.h>

#include <cstdio>

namespace sparq {

ProgressBar::ProgressBar(std::string label, int64_t total)
    : label_(std::move(label)),
      total_(total > 0 ? total : 1),
      enabled_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() {
  if (drawn_) std::fputc('\n', stderr);
}

void ProgressBar::Update(int64_t done, const std::string& note) {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const double frac = static_cast<double>(done) / static_cast<double>(total_);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = done > 0 ? elapsed * (1.0 - frac) / frac : 0.0;
  const int fill = static_cast<int>(frac * kWidth + 0.5);
  std::string bar(static_cast<size_t>(fill), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %lld/%lld  %.0fs elapsed, ETA %.0fs %s\x1b[K", label_.c_str(),
               bar.c_str(), static_cast<long long>(done), static_cast<long long>(total_), elapsed,
               eta, note.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace sparq
