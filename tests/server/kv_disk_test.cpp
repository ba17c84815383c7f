// `magnetar serve --kv-disk-dir`: with one slot, conversation A's KV is evicted by B, yet A's next request gets its
// prefix back from disk: reported as cached tokens, counted by /metrics' disk KV counters, and with the same
// greedy answer as when A's prefix was computed.
#include <unistd.h>

#include <filesystem>

#include "tests/server/harness.h"

namespace magnetar::test {
namespace {

std::string kv_dir() { return ::testing::TempDir() + "serve_kv_disk_" + std::to_string(getpid()); }

class ServeKvDisk : public ServeFixture {
 protected:
  static void SetUpTestSuite() {
    std::filesystem::remove_all(kv_dir());
    start_server({"--parallel", "1", "--kv-disk-dir", kv_dir(), "--kv-disk-gb", "0.1", "--kv-block", "16"});
  }
  static void TearDownTestSuite() {
    ServeFixture::TearDownTestSuite();
    std::filesystem::remove_all(kv_dir());
  }
};

json ask(const std::string& content) {
  return {{"messages", {{{"role", "user"}, {"content", content}}}}, {"temperature", 0}, {"max_tokens", 6}};
}

TEST_F(ServeKvDisk, AnEvictedConversationComesBackFromDisk) {
  const std::string a = "Tell me about the sea and the ships that sail on it, and about the sailors who work them "
                        "from morning until night.";
  int status = 0;
  const json first = post("/v1/chat/completions", ask(a), &status);
  ASSERT_EQ(status, 200) << first.dump();
  const int prompt = first["usage"]["prompt_tokens"].get<int>();
  ASSERT_GE(prompt, 32) << "the prompt must fill two 16-token blocks";
  EXPECT_GE(metric("magnetar_kv_disk_blocks_saved_total"), double(prompt / 16));
  post("/v1/chat/completions", ask("What is bread?"), &status);  // evicts A from the only slot
  ASSERT_EQ(status, 200);
  const double restored_before = metric("magnetar_kv_disk_tokens_restored_total");
  const json again = post("/v1/chat/completions", ask(a), &status);
  ASSERT_EQ(status, 200) << again.dump();
  // Whole blocks of A's prompt, short of its last token (always computed), come from disk.
  const int cached = again["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  EXPECT_EQ(cached, (prompt - 1) / 16 * 16) << again.dump();
  EXPECT_EQ(metric("magnetar_kv_disk_tokens_restored_total") - restored_before, double(cached));
  EXPECT_EQ(again["choices"][0]["message"]["content"], first["choices"][0]["message"]["content"]);
}

}  // namespace
}  // namespace magnetar::test
