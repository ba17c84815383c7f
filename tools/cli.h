// Command-line flags declared once (STYLE.md rule 4): each flag's name, value placeholder, default and
// help text live in one list, from which parsing and `--help` are both derived.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace magnetar::cli {

class Args {
 public:
  // usage: e.g. "magnetar inspect MODEL.gguf [options]"; summary: one paragraph on what the command does.
  Args(std::string usage, std::string summary);

  void flag(std::string_view name, bool* target, std::string_view help);
  void option(std::string_view name, std::string* target, std::string_view metavar, std::string_view help);
  void option(std::string_view name, int64_t* target, std::string_view metavar, std::string_view help);
  void option(std::string_view name, float* target, std::string_view metavar, std::string_view help);
  // Repeatable option: every occurrence appends.
  void option(std::string_view name, std::vector<std::string>* target, std::string_view metavar, std::string_view help);
  void positional(std::string_view name, std::string* target, std::string_view help);

  // Parses argv[first..]. On --help prints help() to stdout and sets help_requested().
  Status parse(int argc, char** argv, int first);
  bool help_requested() const { return help_requested_; }
  // parse() for a subcommand's main: returns the exit code to return with right away (0 after --help,
  // 2 after printing "magnetar COMMAND: error"), or nullopt when the command should run.
  std::optional<int> parse_or_exit(int argc, char** argv, const char* command);
  std::string help() const;

 private:
  struct Spec {
    std::string name;
    std::string metavar;
    std::string help;
    bool* as_bool = nullptr;
    std::string* as_string = nullptr;
    int64_t* as_int = nullptr;
    float* as_float = nullptr;
    std::vector<std::string>* as_list = nullptr;
    std::string default_text;
  };
  std::string usage_;
  std::string summary_;
  std::vector<Spec> options_;
  std::vector<Spec> positionals_;
  bool help_requested_ = false;
};

// The whole content of a file; the error names the file.
Result<std::string> read_file(const std::string& path);

}  // namespace magnetar::cli
