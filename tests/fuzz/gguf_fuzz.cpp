// libFuzzer target for the GGUF header parser (built by `make fuzz` with clang++).
#include <cstddef>
#include <cstdint>

#include "gguf/reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  magnetar::Result<magnetar::gguf::Header> h = magnetar::gguf::parse_header({data, size}, size, "fuzz.gguf");
  if (h.ok()) {
    for (const magnetar::gguf::TensorInfo& t : h->tensors) {
      if (h->data_offset + t.offset + t.nbytes > size) __builtin_trap();
    }
  }
  return 0;
}
