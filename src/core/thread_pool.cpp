#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace mere {
namespace {

void pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

class ThreadPool {
 public:
  explicit ThreadPool(int n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { work(); });
    size_ = n;
  }
  ~ThreadPool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return size_; }

  // Runs job(i) for i in [0, n_jobs), the caller taking part.
  void run(int n_jobs, const std::function<void(int)>& job) {
    std::unique_lock lock(mutex_);
    job_ = &job;
    n_jobs_ = n_jobs;
    done_.store(0);
    const uint64_t generation = generation_.load() + 1;
    next_.store(generation << 32);
    generation_.store(generation);
    lock.unlock();
    wake_.notify_all();  // only the workers asleep need it; the spinning ones see generation_
    drain(generation, job, n_jobs);
    if (!spin_until([&] { return done_.load() == n_jobs; })) {
      lock.lock();
      finished_.wait(lock, [&] { return done_.load() == n_jobs; });
      lock.unlock();
    }
    lock.lock();
    job_ = nullptr;
  }

 private:
  // Runs the jobs of run() number `generation` that nobody has claimed. A claim
  // moves next_ (the generation in its high 32 bits, the next job in the low)
  // on only while it still holds this generation: a worker that wakes for one
  // run and gets to its claim after the next run began claims nothing, rather
  // than a job of the next run that would then run twice (and leave done_ past
  // n_jobs_, the caller waiting forever).
  void drain(uint64_t generation, const std::function<void(int)>& job, int n_jobs) {
    int finished_here = 0;
    for (uint64_t claim = next_.load();;) {
      if (claim >> 32 != (generation & 0xffffffffu) || int(claim & 0xffffffffu) >= n_jobs) break;
      if (!next_.compare_exchange_weak(claim, claim + 1)) continue;  // claim now holds the current value
      job(int(claim & 0xffffffffu));
      ++finished_here;
      claim = next_.load();
    }
    if (finished_here && done_.fetch_add(finished_here) + finished_here == n_jobs) {
      std::lock_guard lock(mutex_);  // the caller may be between its check and its wait
      finished_.notify_all();
    }
  }

  // Decode runs a parallel_for every few microseconds, and a futex wake costs
  // tens of them: a thread waiting for work, or for the last jobs of its run,
  // spins this long before it sleeps. False when it gave up.
  template <class Ready>
  static bool spin_until(Ready ready) {
    constexpr auto kSpin = std::chrono::microseconds(200);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0;; ++i) {
      if (ready()) return true;
      if (i % 64 == 63 && std::chrono::steady_clock::now() - start > kSpin) return false;
      pause();
    }
  }
  void work() {
    uint64_t seen = 0;
    for (;;) {
      spin_until([&] { return generation_.load() != seen || stopping_.load(); });
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || (generation_.load() != seen && job_ != nullptr); });
      if (stopping_) return;
      seen = generation_.load();
      // Valid until run() returns, which it cannot while a claim of ours runs.
      const std::function<void(int)>* job = job_;
      const int n_jobs = n_jobs_;
      lock.unlock();
      drain(seen, *job, n_jobs);
    }
  }

  std::vector<std::thread> workers_;
  int size_ = 1;
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  const std::function<void(int)>* job_ = nullptr;  // job_ and n_jobs_ change under mutex_
  int n_jobs_ = 0;
  std::atomic<int> done_{0};
  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> generation_{0};  // written under mutex_, read by spinning workers without it
  std::atomic<bool> stopping_{false};
};

int g_requested = 0;
thread_local bool t_inside_pool = false;

ThreadPool& pool() {
  static ThreadPool p(g_requested > 0 ? g_requested
                                      : std::max(1, int(std::thread::hardware_concurrency())));
  return p;
}

}  // namespace

int thread_count() { return pool().size(); }
void set_thread_count(int n) { g_requested = n; }

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t max_chunks = (n + grain - 1) / grain;
  if (t_inside_pool || max_chunks == 1 || pool().size() == 1) {
    fn(0, n);
    return;
  }
  int chunks = int(std::min<int64_t>(max_chunks, int64_t(pool().size()) * 4));
  pool().run(chunks, [&](int c) {
    t_inside_pool = true;
    int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
    if (begin < end) fn(begin, end);
    t_inside_pool = false;
  });
}

}  // namespace mere
