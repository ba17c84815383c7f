#include "tools/cli.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace magnetar::cli {

Args::Args(std::string usage, std::string summary) : usage_(std::move(usage)), summary_(std::move(summary)) {}

void Args::flag(std::string_view name, bool* target, std::string_view help) {
  Spec s;
  s.name = name;
  s.help = help;
  s.as_bool = target;
  options_.push_back(std::move(s));
}

void Args::option(std::string_view name, std::string* target, std::string_view metavar, std::string_view help) {
  options_.push_back({.name = std::string(name), .metavar = std::string(metavar), .help = std::string(help),
                      .as_string = target, .default_text = *target});
}

void Args::option(std::string_view name, int64_t* target, std::string_view metavar, std::string_view help) {
  options_.push_back({.name = std::string(name), .metavar = std::string(metavar), .help = std::string(help),
                      .as_int = target, .default_text = std::to_string(*target)});
}

void Args::option(std::string_view name, float* target, std::string_view metavar, std::string_view help) {
  Spec s;
  s.name = name;
  s.metavar = metavar;
  s.help = help;
  s.as_float = target;
  s.default_text = format("%g", double(*target));
  options_.push_back(std::move(s));
}

void Args::option(std::string_view name, std::vector<std::string>* target, std::string_view metavar,
                  std::string_view help) {
  Spec s;
  s.name = name;
  s.metavar = metavar;
  s.help = help;
  s.as_list = target;
  options_.push_back(std::move(s));
}

void Args::positional(std::string_view name, std::string* target, std::string_view help) {
  Spec s;
  s.name = name;
  s.help = help;
  s.as_string = target;
  positionals_.push_back(std::move(s));
}

Status Args::parse(int argc, char** argv, int first) {
  size_t next_positional = 0;
  for (int k = first; k < argc; ++k) {
    std::string arg = argv[k];
    if (arg == "-h" || arg == "--help") {
      std::fputs(help().c_str(), stdout);
      help_requested_ = true;
      return Status();
    }
    if (arg.size() > 1 && arg[0] == '-') {
      std::string value;
      bool has_value = false;
      if (const size_t eq = arg.find('='); eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_value = true;
      }
      const Spec* spec = nullptr;
      for (const Spec& s : options_) {
        if (s.name == arg) spec = &s;
      }
      if (!spec) return Status::error(format("unknown option '%s' (see --help)", arg.c_str()));
      if (spec->as_bool) {
        if (has_value) return Status::error(format("option '%s' takes no value", arg.c_str()));
        *spec->as_bool = true;
        continue;
      }
      if (!has_value) {
        if (k + 1 >= argc) return Status::error(format("option '%s' needs a value %s", arg.c_str(), spec->metavar.c_str()));
        value = argv[++k];
      }
      if (spec->as_string) {
        *spec->as_string = value;
      } else if (spec->as_list) {
        spec->as_list->push_back(value);
      } else if (spec->as_float) {
        char* end = nullptr;
        errno = 0;
        const float v = std::strtof(value.c_str(), &end);
        if (value.empty() || *end != '\0' || errno != 0 || !std::isfinite(v)) {
          return Status::error(format("option '%s': '%s' is not a finite number", arg.c_str(), value.c_str()));
        }
        *spec->as_float = v;
      } else {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || errno != 0) {
          return Status::error(format("option '%s': '%s' is not an integer", arg.c_str(), value.c_str()));
        }
        *spec->as_int = v;
      }
      continue;
    }
    if (next_positional >= positionals_.size()) {
      return Status::error(format("unexpected argument '%s' (see --help)", arg.c_str()));
    }
    *positionals_[next_positional++].as_string = arg;
  }
  if (next_positional < positionals_.size()) {
    return Status::error(format("missing %s (see --help)", positionals_[next_positional].name.c_str()));
  }
  return Status();
}

std::optional<int> Args::parse_or_exit(int argc, char** argv, const char* command) {
  const Status s = parse(argc, argv, 1);
  if (!s.ok()) {
    std::fprintf(stderr, "magnetar %s: %s\n", command, s.message().c_str());
    return 2;
  }
  if (help_requested_) return 0;
  return std::nullopt;
}

Result<std::string> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return Status::error(format("%s: cannot open: %s", path.c_str(), std::strerror(errno)));
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Status::error(format("%s: read error", path.c_str()));
  return text;
}

std::string Args::help() const {
  std::string out = "usage: " + usage_ + "\n\n" + summary_ + "\n";
  if (!positionals_.empty()) {
    out += "\narguments:\n";
    for (const Spec& s : positionals_) out += format("  %-24s %s\n", s.name.c_str(), s.help.c_str());
  }
  out += "\noptions:\n";
  for (const Spec& s : options_) {
    const std::string left = s.metavar.empty() ? s.name : s.name + " " + s.metavar;
    std::string line = format("  %-24s %s", left.c_str(), s.help.c_str());
    if (!s.as_bool && !s.default_text.empty()) line += " (default: " + s.default_text + ")";
    out += line + "\n";
  }
  out += format("  %-24s %s\n", "-h, --help", "show this help");
  return out;
}

}  // namespace magnetar::cli
