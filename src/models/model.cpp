#include "models/model.h"

#include <algorithm>

namespace mere {

Tensor Model::forward(const std::vector<int32_t>& tokens, SeqState& state, bool all_logits) const {
  const int64_t T = int64_t(tokens.size()), pos0 = state.length();
  MERE_CHECK(T > 0, "forward: no tokens");
  MERE_CHECK(pos0 + T <= state.capacity(), "context is full: {} + {} tokens exceed the capacity of {}", pos0, T,
             state.capacity());
  state.reserve(pos0 + T);
  Tensor ids = Tensor::empty({T}, DType::i32), pos = Tensor::empty({1}, DType::i32);
  std::copy(tokens.begin(), tokens.end(), ids.data<int32_t>());
  pos.data<int32_t>()[0] = int32_t(pos0);
  Tensor logits = run(ids.to_device(info().device), pos.to_device(info().device), state, all_logits);
  state.advance(T);
  return logits;
}

}  // namespace mere
