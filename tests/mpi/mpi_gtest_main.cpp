// GoogleTest main for tests run under mpirun: every rank runs every test; the exit status is
// non-zero on any rank that failed, so mpirun reports the failure.
#include <gtest/gtest.h>

#include "dist/mpi_context.h"

int main(int argc, char** argv) {
  dspine::dist::MpiContext mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  if (mpi.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  return RUN_ALL_TESTS();
}
