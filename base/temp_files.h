// Temporary output files that an interrupted process removes: a Ctrl-C (SIGINT, SIGTERM, SIGHUP) during a long
// write (quantize, convert, pack, perplexity --kl-base) left NAME.tmp behind, as large as the output. A writer adds its
// temporary once created and takes it off once renamed into place or deleted; the handler (installed by the CLI)
// unlinks what is listed and dies of the signal as before. A fixed table of paths: the handler only calls unlink,
// signal and raise (async-signal-safe).
#pragma once

#include <cstdint>
#include <string>

namespace magnetar::temp_files {

// Installs the handler for SIGINT, SIGTERM and SIGHUP, except those already ignored (nohup); a command that handles
// them itself (serve) does not call it.
void remove_on_signal();
// Lists `path`; the handle for forget(), -1 when the table is full or the path too long (then it is not removed).
int add(const std::string& path);
// Takes the entry off (the file was renamed or deleted); -1 is ignored.
void forget(int handle);
// A number for a temporary's name beside the pid: another process of the same pid (containers sharing a folder each
// run as pid 1) draws another one (the clock and a per-process count, mixed).
uint64_t nonce();

}  // namespace magnetar::temp_files
