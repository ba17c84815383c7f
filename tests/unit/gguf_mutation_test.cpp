// Seeded mutation test of the GGUF header parser: 100,000 corrupted variants of a valid file, each parsed
// from a heap buffer of exactly its size, so any out-of-bounds read is caught when the suite runs under
// AddressSanitizer/UBSan (`make test-asan`). Every parse must either fail with a message naming the file or
// succeed with every tensor inside the file.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "gguf/reader.h"
#include "tests/unit/gguf_test_util.h"

namespace magnetar::gguf {
namespace {

constexpr int kMutations = 100000;

std::vector<uint8_t> mutate(const std::vector<uint8_t>& good, std::mt19937_64& rng) {
  std::vector<uint8_t> b = good;
  const int kind = int(rng() % 6);
  const size_t n_edits = 1 + rng() % 4;
  for (size_t e = 0; e < n_edits && !b.empty(); ++e) {
    const size_t at = rng() % b.size();
    switch (kind) {
      case 0: b[at] = uint8_t(rng()); break;                       // random byte
      case 1: b[at] ^= uint8_t(1u << (rng() % 8)); break;          // bit flip
      case 2: {                                                    // interesting 64-bit value
        static const uint64_t kValues[] = {0, 1, 0xff, 0xffffffffull, 0x7fffffffffffffffull, ~0ull, 1ull << 32,
                                           1ull << 62, 31, 33, 4096};
        const uint64_t v = kValues[rng() % (sizeof(kValues) / sizeof(kValues[0]))];
        for (size_t k = 0; k < 8 && at + k < b.size(); ++k) b[at + k] = uint8_t(v >> (8 * k));
        break;
      }
      case 3: b.resize(at); break;                                 // truncate
      case 4: b.insert(b.begin() + ptrdiff_t(at), uint8_t(rng())); break;  // insert
      default: b.erase(b.begin() + ptrdiff_t(at)); break;          // delete
    }
  }
  return b;
}

TEST(GgufMutation, HundredThousandCorruptHeadersNeverCrash) {
  testing::TempDir dir;
  const std::vector<uint8_t> good = testing::make_sample_gguf(dir.file("s.gguf"));
  std::mt19937_64 rng(20261130);
  int parsed = 0, rejected = 0;
  for (int k = 0; k < kMutations; ++k) {
    const std::vector<uint8_t> bytes = mutate(good, rng);
    // exact-size heap copy: ASan flags any read past its end
    std::unique_ptr<uint8_t[]> heap(new uint8_t[bytes.size() + 1]);
    std::memcpy(heap.get(), bytes.data(), bytes.size());
    Result<Header> h = parse_header({heap.get(), bytes.size()}, bytes.size(), "m.gguf");
    if (!h.ok()) {
      ++rejected;
      ASSERT_EQ(h.status().message().rfind("m.gguf: ", 0), 0u) << h.status().message();
      continue;
    }
    ++parsed;
    for (const TensorInfo& t : h->tensors) {
      ASSERT_LE(h->data_offset + t.offset + t.nbytes, bytes.size()) << t.name;
    }
  }
  // Both outcomes must occur, or the mutator is not exercising the parser.
  EXPECT_GT(parsed, 100);
  EXPECT_GT(rejected, kMutations / 2);
  std::printf("mutations: %d parsed, %d rejected\n", parsed, rejected);
}

}  // namespace
}  // namespace magnetar::gguf
