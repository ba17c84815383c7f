// A progress bar on stderr for long jobs (convert, quantize, synth, perplexity). Silent for jobs that finish
// within a second. When stderr is not a terminal (a log file, nohup, systemd) a plain line every 30 seconds instead,
// so that a stalled job can be told from a working one.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace magnetar::tools {

class Progress {
 public:
  Progress(std::string label, uint64_t total) : label_(std::move(label)), total_(total) {}

  // Sets the amount done; redraws at most ~10 times a second.
  void update(uint64_t done) {
    done_ = done;
    const double t = seconds();
    const bool tty = isatty(STDERR_FILENO);
    if (t < 1.0 || t - last_draw_ < (tty ? 0.1 : 30.0)) return;
    last_draw_ = t;
    const double frac = total_ ? double(done_) / double(total_) : 1.0;
    if (!tty) {
      std::fprintf(stderr, "%s: %.1f%%, %.0fs elapsed, ~%.0fs left\n", label_.c_str(), 100 * frac, t,
                   frac > 0 ? t / frac - t : 0.0);
      return;
    }
    const int width = 30;
    const int fill = int(frac * width);
    const double eta = frac > 0 ? t / frac - t : 0;
    std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%%  %.0fs elapsed, ~%.0fs left ", label_.c_str(), fill,
                 "##############################", width - fill, "", 100 * frac, t, eta);
    drawn_ = true;
  }

  // Ends the bar with a summary line (printed whenever the job took over a second).
  void finish(const std::string& summary) {
    if (drawn_) std::fprintf(stderr, "\r%*s\r", 100, "");
    if (seconds() >= 1.0) std::fprintf(stderr, "%s: %s in %.1fs\n", label_.c_str(), summary.c_str(), seconds());
  }

  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  double last_draw_ = 0;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace magnetar::tools
