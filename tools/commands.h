// The subcommands of the `magnetar` binary. Each is a thin main over the libraries: it parses its flags
// (tools/cli.h), calls into the library and maps Status to a one-line error and an exit code.
#pragma once

namespace magnetar::tools {

// Exit codes shared by all subcommands.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // the work itself failed (I/O error while writing, ...)
inline constexpr int kExitBadInput = 2;  // bad flags, unreadable or invalid input file

int inspect_main(int argc, char** argv);  // argv[0] is the command name
int synth_main(int argc, char** argv);
int convert_main(int argc, char** argv);
int quantize_main(int argc, char** argv);
int pack_main(int argc, char** argv);
int tokenize_main(int argc, char** argv);
int run_main(int argc, char** argv);
int chat_main(int argc, char** argv);
int perplexity_main(int argc, char** argv);
int bench_main(int argc, char** argv);
int serve_main(int argc, char** argv);

}  // namespace magnetar::tools
