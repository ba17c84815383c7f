// experts::LaneBalance, the CPU expert lane's share of a layer's misses: the count that ends the lane and the copies
// soonest from their measured times, worked out by hand below (times in microseconds; the lane and the bus run at
// once, so a layer waits for max(lane time, copy time)).
#include <gtest/gtest.h>

#include <algorithm>

#include "experts/policy.h"

namespace magnetar::experts {
namespace {

constexpr double kUs = 1e-6;

// A balance whose lane has had its first run (not kept: it pays the first touches of the lane's buffers).
LaneBalance warmed() {
  LaneBalance b;
  b.lane_ran(1, 1.0);
  return b;
}

// A warmed balance that timed copies at `copy_us` per expert and lanes of 1 and 2 experts at lane1_us and lane2_us.
LaneBalance measured(double copy_us, double lane1_us, double lane2_us) {
  LaneBalance b = warmed();
  b.copies_ran(1, copy_us * kUs);
  b.lane_ran(1, lane1_us * kUs);
  b.lane_ran(2, lane2_us * kUs);
  return b;
}

TEST(LaneBalance, TakesEveryColdMissUntilBothSidesAreMeasured) {
  LaneBalance b;
  EXPECT_EQ(b.lane_count(3, 2), 2);
  b.lane_ran(1, 85 * kUs);
  b.lane_ran(1, 85 * kUs);
  EXPECT_EQ(b.lane_count(3, 2), 2) << "no copy timed yet";
  LaneBalance c;
  c.copies_ran(2, 120 * kUs);
  EXPECT_EQ(c.lane_count(3, 2), 2) << "no lane timed yet";
  c.lane_ran(1, 1e-9);
  EXPECT_EQ(c.lane_count(3, 2), 2) << "the lane's first run is not kept";
  EXPECT_EQ(c.lane_count(3, 0), 0);
}

// Copies 60 us per expert, the lane 85 us for one expert and 170 for two.
TEST(LaneBalance, SplitsTheMissesWhereBothEndSoonest) {
  LaneBalance b = measured(60, 85, 170);
  // Two misses: both on the lane 170, one each max(85, 60) = 85, both copied 120.
  EXPECT_EQ(b.lane_count(2, 2), 1);
  // Three: lane 3 (scaled from 2: 255), 2 + 1 copy max(170, 60), 1 + 2 copies max(85, 120) = 120, 0: 180.
  EXPECT_EQ(b.lane_count(3, 3), 1);
  // Only one cold miss among three: lane 1 + 2 copies (120) beats 3 copies (180).
  EXPECT_EQ(b.lane_count(3, 1), 1);
  // A miss the pool admits is copied anyway: of 2 with none cold, none.
  EXPECT_EQ(b.lane_count(2, 0), 0);
}

TEST(LaneBalance, ASlowBusSendsEveryColdMissToTheLane) {
  LaneBalance b = measured(200, 85, 170);
  EXPECT_EQ(b.lane_count(2, 2), 2);  // 170 against max(85, 200) and 400
}

TEST(LaneBalance, AFastBusCopiesEverything) {
  LaneBalance b = warmed();
  b.copies_ran(4, 80 * kUs);  // 20 per expert
  b.lane_ran(1, 85 * kUs);
  EXPECT_EQ(b.lane_count(3, 3), 0);  // 60 against max(85, 40) and more
}

TEST(LaneBalance, TiesGoToTheLargerLane) {
  LaneBalance b = measured(120, 60, 120);
  EXPECT_EQ(b.lane_count(2, 2), 2);  // 120 both on the lane, max(60, 120) = 120 one each: fewer bytes copied
}

// Sizes not measured take the nearest measured size's time per expert, beyond kSizes too.
TEST(LaneBalance, ScalesFromTheNearestMeasuredSize) {
  LaneBalance b = warmed();
  b.copies_ran(1, 150 * kUs);
  b.lane_ran(4, 400 * kUs);          // 100 per expert
  EXPECT_EQ(b.lane_count(2, 2), 1);  // 200, max(100, 150), 300
  LaneBalance c = warmed();
  c.copies_ran(1, 100 * kUs);
  c.lane_ran(LaneBalance::kSizes, double(LaneBalance::kSizes) * 100 * kUs);
  EXPECT_EQ(c.lane_count(20, 20), 10);       // max(100 L, 100 (20 - L)) is least at L = 10
  c.lane_ran(LaneBalance::kSizes + 1, 1.0);  // a size beyond kSizes is not kept
  EXPECT_EQ(c.lane_count(20, 20), 10);
}

// The times follow the latest measurements: a lane that got faster wins the split back.
TEST(LaneBalance, FollowsTheLatestMeasurements) {
  LaneBalance b = warmed();
  b.copies_ran(1, 100 * kUs);
  b.lane_ran(1, 400 * kUs);
  EXPECT_EQ(b.lane_count(1, 1), 0);  // 400 against 100
  for (int i = 0; i < 50; ++i) b.lane_ran(1, 50 * kUs);
  EXPECT_EQ(b.lane_count(1, 1), 1);  // ~50 against 100
}

// A lane that lost the split gets one expert again after kProbeEvery calls that could have given it some, so that a
// slow measurement (a loaded machine, a page fault) does not keep it idle for good; calls without cold misses do not
// count.
TEST(LaneBalance, ProbesAnIdleLaneAgain) {
  LaneBalance b = warmed();
  b.copies_ran(1, 100 * kUs);
  b.lane_ran(1, 400 * kUs);
  for (int64_t i = 1; i < LaneBalance::kProbeEvery; ++i) {
    ASSERT_EQ(b.lane_count(2, 2), 0) << "call " << i;
    ASSERT_EQ(b.lane_count(2, 0), 0);
  }
  EXPECT_EQ(b.lane_count(2, 2), 1) << "the probe";
  b.lane_ran(1, 60 * kUs);  // faster now: 400 + (60 - 400) / 8 = 357.5, still slower than two copies' 200
  EXPECT_EQ(b.lane_count(2, 2), 0);
}

// Each probe that leaves the lane idle doubles the interval to the next one (64, 128, 256, ... up to kProbeMax calls);
// once the split gives the lane experts itself, an idle lane is probed after kProbeEvery calls again.
TEST(LaneBalance, ProbesALosingLaneEverMoreRarely) {
  LaneBalance b = warmed();
  b.copies_ran(1, 100 * kUs);
  b.lane_ran(1, 4000 * kUs);  // a probe of sleeping threads: far slower than a copy
  // The calls until the lane's next probe (the probes' own lane runs as slow as the first).
  auto calls_to_probe = [&] {
    for (int64_t i = 1; i <= 2 * LaneBalance::kProbeMax; ++i) {
      if (b.lane_count(2, 2) == 1) {
        b.lane_ran(1, 4000 * kUs);
        return i;
      }
    }
    return int64_t(-1);
  };
  int64_t want = LaneBalance::kProbeEvery;
  for (int probe = 0; probe < 8; ++probe) {
    EXPECT_EQ(calls_to_probe(), want) << "probe " << probe;
    want = std::min(2 * want, LaneBalance::kProbeMax);
  }
  EXPECT_EQ(want, LaneBalance::kProbeMax) << "the intervals reached the cap";
  EXPECT_EQ(calls_to_probe(), LaneBalance::kProbeMax);
  // The bus slows down (copies of 5 ms): the split itself gives the lane an expert, and the interval starts over.
  for (int i = 0; i < 64; ++i) b.copies_ran(1, 5000 * kUs);
  EXPECT_EQ(b.lane_count(2, 2), 1) << "4 ms on the lane against two 5 ms copies: one on each side";
  for (int i = 0; i < 64; ++i) b.copies_ran(1, 100 * kUs);
  EXPECT_EQ(calls_to_probe(), LaneBalance::kProbeEvery);
}

}  // namespace
}  // namespace magnetar::experts
