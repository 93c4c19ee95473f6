#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "helpers.h"
#include "inner/blas_core.h"

// As `xloco` does (src/cli/main.cpp): the suites that train run on the OpenBLAS kernels the CPU
// can run, not on a generic fallback (src/inner/blas_core.h).
int main(int argc, char** argv) {
  const std::string note = xloco::inner::reexec_with_blas_core(argv);
  if (!note.empty()) std::fprintf(stderr, "xloco_tests: warning: %s\n", note.c_str());
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (rc == 0 && xloco::test::skipped_cases() > 0) {
    std::fprintf(stderr, "xloco_tests: %d case(s) skipped (see 'skipped:' above): exit 77, ctest's SKIP_RETURN_CODE\n",
                 xloco::test::skipped_cases().load());
    return 77;
  }
  return rc;
}
