// How a model scores a text: from a session's logits of every position (Logits::kAll) over `tokens`, the mean
// negative log-likelihood of each next token (in nats, the softmax in double) and the top-1 prediction at every
// position but the last. Shared by the engine tests that compare two ways of computing the same model.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace magnetar::testing {

struct TextScore {
  double nll = 0;
  std::vector<int32_t> top1;
};

inline TextScore score_text(std::span<const float> all_logits, std::span<const int32_t> tokens, size_t n_vocab) {
  TextScore out;
  if (tokens.size() < 2) return out;
  for (size_t p = 0; p + 1 < tokens.size(); ++p) {
    const std::span<const float> row = all_logits.subspan(p * n_vocab, n_vocab);
    const float mx = *std::max_element(row.begin(), row.end());
    double sum = 0;
    for (const float v : row) sum += std::exp(double(v - mx));
    out.nll += std::log(sum) - double(row[size_t(tokens[p + 1])] - mx);
    out.top1.push_back(int32_t(std::max_element(row.begin(), row.end()) - row.begin()));
  }
  out.nll /= double(tokens.size() - 1);
  return out;
}

}  // namespace magnetar::testing
