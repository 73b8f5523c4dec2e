#include "core/error.h"

#include <cstdio>
#include <cstdlib>

namespace mere {

void assert_failed(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "mere: internal error: %s (%s:%d)\n", condition, file, line);
  std::abort();
}

}  // namespace mere
