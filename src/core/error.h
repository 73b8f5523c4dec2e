// Errors: mere::Error for bad input (the CLI prints it and exits non-zero),
// MERE_CHECK for argument checks, MERE_ASSERT for internal invariants.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace mere {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

[[noreturn]] void assert_failed(const char* condition, const char* file, int line);

}  // namespace mere

#define MERE_CHECK(condition, ...)                   \
  do {                                               \
    if (!(condition)) ::mere::fail(__VA_ARGS__);     \
  } while (0)

#define MERE_ASSERT(condition)                                                   \
  do {                                                                           \
    if (!(condition)) ::mere::assert_failed(#condition, __FILE__, __LINE__);     \
  } while (0)
