// A fixed pool of worker threads sized to the machine, and parallel_for over it.
#pragma once

#include <cstdint>
#include <functional>

namespace mere {

// Splits [0, n) into contiguous chunks of at least `grain` items and runs
// fn(begin, end) on the pool; returns when every chunk is done. Nested calls run inline.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

int thread_count();
void set_thread_count(int n);  // 0: one per hardware thread

}  // namespace mere
