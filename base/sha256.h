// SHA-256 (FIPS 180-4). Used to identify model files and to check conformance vectors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace magnetar {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> finish();
  // Lower-case hex of finish().
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

}  // namespace magnetar
