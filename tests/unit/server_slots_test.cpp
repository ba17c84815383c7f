// server::choose_slot: which idle slot a request's prompt goes to.
#include <gtest/gtest.h>

#include <numeric>

#include "server/worker.h"

namespace magnetar::server {
namespace {

std::vector<int32_t> seq(int32_t from, size_t n) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}
std::vector<int32_t> join(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(ChooseSlot, ContinuationsReturnToTheirSlotAndForksTakeAnEmptyOne) {
  const std::vector<int32_t> system = seq(0, 20000);                   // system prompt and tools
  const std::vector<int32_t> main = join(system, seq(100000, 40000));  // the main conversation, 60K tokens
  const std::vector<int32_t> other = seq(500000, 3000), empty;
  std::vector<SlotView> slots = {{.busy = false, .last_used = 5, .tokens = &main, .prompt = 59000},
                                 {.busy = false, .last_used = 0, .tokens = &empty, .prompt = 0},
                                 {.busy = false, .last_used = 3, .tokens = &other, .prompt = 2900}};
  // The main conversation's next turn: its slot.
  EXPECT_EQ(choose_slot(slots, join(main, seq(900000, 500))), 0u);
  // The same with its last turn edited: most of the slot is kept.
  EXPECT_EQ(choose_slot(slots, join(std::vector<int32_t>(main.begin(), main.end() - 100), seq(7, 50))), 0u);
  // A subagent sharing the 20K system prompt (22K tokens): the empty slot, not the main one (its 40K tokens of
  // history would be cut) nor the other conversation's.
  const std::vector<int32_t> fork = join(system, seq(800000, 2000));
  EXPECT_EQ(choose_slot(slots, fork), 1u);
  // No empty slot: the fork shares most of its prompt with the main slot, which beats evicting another conversation.
  slots[1].tokens = &other;
  EXPECT_EQ(choose_slot(slots, fork), 0u);
  // An unrelated prompt: the least recently used.
  EXPECT_EQ(choose_slot(slots, seq(-5000, 100)), 1u);
  // The same prompt again after a long answer (a retry): its slot, though the answer is most of the slot's tokens.
  const std::vector<int32_t> answered = join(seq(1, 18), seq(1000, 500)), retry = seq(1, 18);
  std::vector<SlotView> two = {{.busy = false, .last_used = 1, .tokens = &answered, .prompt = 18},
                               {.busy = false, .last_used = 0, .tokens = &empty}};
  EXPECT_EQ(choose_slot(two, retry), 0u);
  // Another conversation sharing a system prompt that is most of the slot's last prompt but little of its tokens
  // (the prompt and a long answer): the empty slot (it took the slot, evicting the answer the next turn reuses).
  const std::vector<int32_t> asked = join(join(seq(1, 25), seq(300, 5)), seq(2000, 150)),
                             other_question = join(seq(1, 25), seq(400, 6));
  std::vector<SlotView> shared = {{.busy = false, .last_used = 1, .tokens = &asked, .prompt = 30},
                                  {.busy = false, .last_used = 0, .tokens = &empty}};
  EXPECT_EQ(choose_slot(shared, other_question), 1u);
  shared[1].busy = true;  // no empty slot: it shares more than half of the last prompt
  EXPECT_EQ(choose_slot(shared, other_question), 0u);
  // Busy slots are never chosen.
  slots[0].busy = slots[1].busy = slots[2].busy = true;
  EXPECT_EQ(choose_slot(slots, fork), SIZE_MAX);
}

}  // namespace
}  // namespace magnetar::server
