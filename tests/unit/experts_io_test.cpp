// The expert store's readers (experts/io.h): io_uring and the pread pool read a list of buffers at an offset alike,
// including a read that runs past the end of the file (a short completion: the io_uring reader queues the rest, as
// the pread pool re-reads it, and both report the bytes up to the end); the io_uring reader reissues a read that
// completes with EAGAIN or EINTR, and gives up after 12 reissues.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "experts/io.h"

namespace magnetar::experts {
namespace {

class ExpertsIo : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "experts_io_" + std::to_string(getpid());
    bytes_.resize(10000);
    for (size_t i = 0; i < bytes_.size(); ++i) bytes_[i] = uint8_t(i * 7 % 253);
    std::ofstream(path_, std::ios::binary).write(reinterpret_cast<const char*>(bytes_.data()), std::streamsize(10000));
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd_, 0);
  }
  void TearDown() override {
    ::close(fd_);
    std::filesystem::remove(path_);
  }
  // Reads `sizes` consecutive buffers at `offset` (tag 7); returns the completion's result and the bytes.
  int64_t read(Reader& reader, uint64_t offset, const std::vector<size_t>& sizes, std::vector<uint8_t>& got) {
    size_t total = 0;
    for (size_t n : sizes) total += n;
    got.assign(total, 0xEE);
    std::vector<iovec> iov;
    for (size_t at = 0, i = 0; i < sizes.size(); at += sizes[i++]) iov.push_back({got.data() + at, sizes[i]});
    reader.submit(fd_, offset, iov, 7);
    std::vector<Completion> done;
    reader.reap(1, done);
    EXPECT_EQ(done.size(), 1u);
    EXPECT_EQ(reader.in_flight(), 0u);
    return done.empty() || done[0].tag != 7 ? -999 : done[0].result;
  }
  void check(Reader& reader) {
    SCOPED_TRACE(reader.name());
    std::vector<uint8_t> got;
    // Inside the file, odd buffer sizes.
    ASSERT_EQ(read(reader, 1001, {3, 4096, 1, 777}, got), 4877);
    EXPECT_EQ(std::memcmp(got.data(), bytes_.data() + 1001, 4877), 0);
    // Past the end: the first completion is short; the result is the 3,800 bytes up to the end.
    ASSERT_EQ(read(reader, 6200, {1000, 2000, 3000}, got), 3800);
    EXPECT_EQ(std::memcmp(got.data(), bytes_.data() + 6200, 3800), 0);
    EXPECT_EQ(got[3800], 0xEE);  // nothing written beyond
    // Wholly past the end: nothing.
    EXPECT_EQ(read(reader, 20000, {100}, got), 0);
    // A bad descriptor: the error.
    std::vector<iovec> iov{{got.data(), 10}};
    reader.submit(-1, 0, iov, 8);
    std::vector<Completion> done;
    reader.reap(1, done);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].result, -EBADF);
  }
  std::string path_;
  std::vector<uint8_t> bytes_;
  int fd_ = -1;
};

TEST_F(ExpertsIo, PreadPoolReadsBuffersAndStopsAtTheEnd) { check(*make_pread_reader(2)); }

TEST_F(ExpertsIo, UringReadsBuffersAndStopsAtTheEnd) {
  std::string why;
  std::unique_ptr<Reader> reader = make_uring_reader(4, &why);
  if (!reader) GTEST_SKIP() << "SKIP: io_uring is not available here: " << why;
  check(*reader);
}

// Completions the kernel may give a busy O_DIRECT read (EAGAIN; EINTR) are reissued, with a growing pause, up to 12
// times per read: with the first three results of every read replaced by EAGAIN (a fault hook; a non-blocking pipe
// does not give EAGAIN, the kernel polls it) every read of check() above, short ones included, completes as before,
// each after pauses of at least 50 + 100 + 200 us.
TEST_F(ExpertsIo, UringReissuesAReadThatCompletesWithEagain) {
  std::string why;
  int calls = 0;
  std::unique_ptr<Reader> reader = make_uring_reader(4, &why, [&](int result, int reissues) {
    ++calls;
    return reissues < 3 ? -EAGAIN : result;
  });
  if (!reader) GTEST_SKIP() << "SKIP: io_uring is not available here: " << why;
  check(*reader);
  EXPECT_GE(calls, 4 * 4 + 1);  // 4 reads of 4 results each, the short one's rest at least one more
  std::vector<uint8_t> got(100);
  std::vector<iovec> iov{{got.data(), got.size()}};
  reader->submit(fd_, 500, iov, 9);
  std::vector<Completion> done;
  reader->reap(1, done);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].result, 100);
  EXPECT_GE(done[0].seconds, 350e-6);
  EXPECT_EQ(std::memcmp(got.data(), bytes_.data() + 500, 100), 0);
}

// A read that keeps completing with EAGAIN (or EINTR) fails with it after 12 reissues (13 results), instead of
// being retried forever; the reader goes on with the next read.
TEST_F(ExpertsIo, UringGivesUpOnAReadAfterTwelveReissues) {
  for (const int error : {EAGAIN, EINTR}) {
    std::string why;
    int calls = 0;
    bool failing = true;
    std::unique_ptr<Reader> reader = make_uring_reader(4, &why, [&](int result, int) {
      ++calls;
      return failing ? -error : result;
    });
    if (!reader) GTEST_SKIP() << "SKIP: io_uring is not available here: " << why;
    std::vector<uint8_t> got;
    EXPECT_EQ(read(*reader, 0, {64}, got), -error);
    EXPECT_EQ(calls, 13) << std::strerror(error);
    failing = false;
    ASSERT_EQ(read(*reader, 0, {64}, got), 64);
    EXPECT_EQ(std::memcmp(got.data(), bytes_.data(), 64), 0);
  }
}

}  // namespace
}  // namespace magnetar::experts
