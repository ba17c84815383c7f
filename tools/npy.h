// Minimal .npy (NumPy format 1.0) writer for float32 matrices: logits dumps that Python and the golden
// tests read back.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "base/status.h"

namespace magnetar::tools {

// Writes data [rows, cols] (row-major float32) to `path` atomically (temp file + rename).
inline Status write_npy(const std::string& path, const float* data, int64_t rows, int64_t cols) {
  std::string header = format("{'descr': '<f4', 'fortran_order': False, 'shape': (%lld, %lld), }", (long long)rows,
                              (long long)cols);
  // magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64, ending in \n
  const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
  header.append(total - 10 - header.size() - 1, ' ');
  header += '\n';
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return Status::error(format("%s: cannot create", tmp.c_str()));
  const uint16_t len = uint16_t(header.size());
  bool ok = std::fwrite("\x93NUMPY\x01\x00", 1, 8, f) == 8 && std::fwrite(&len, 2, 1, f) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(data, sizeof(float), size_t(rows * cols), f) == size_t(rows * cols);
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return Status::error(format("%s: write failed", path.c_str()));
  }
  return Status();
}

}  // namespace magnetar::tools
