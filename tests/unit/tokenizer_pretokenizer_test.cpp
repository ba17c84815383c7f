// The pre-tokenizer on pathological input: a run of millions of whitespace characters (a 12 MB prompt of spaces
// aborted the process: PCRE2's default match limit, 10M steps, failed the match and a CHECK fired).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/pretokenizer.h"

namespace magnetar::tokenizer {
namespace {

TEST(PreTokenizerLimits, TwelveMillionSpacesSplitAsShortRunsDo) {
  for (const PreType type : {PreType::kQwen2, PreType::kLlama3}) {
    Result<PreTokenizer> pre = PreTokenizer::create(type);
    ASSERT_TRUE(pre.ok()) << pre.status().message();
    for (const size_t n : {size_t(5), size_t(12000000)}) {
      const std::string text = "a" + std::string(n, ' ') + "b";
      std::vector<std::string_view> pieces;
      pre.value().split(text, &pieces);
      // "a", the spaces but the last, and " b" (the last space goes with the word, as in HF).
      ASSERT_EQ(pieces.size(), 3u) << n;
      EXPECT_EQ(pieces[0], "a");
      EXPECT_EQ(pieces[1].size(), n - 1);
      EXPECT_EQ(pieces[2], " b");
    }
  }
}

}  // namespace
}  // namespace magnetar::tokenizer
