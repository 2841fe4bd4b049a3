// Where this process sits in the job and which communicator it uses. mpirun gives rank, world
// size and local rank (rank among the processes of one host); each rank drives GPU = local rank.
#pragma once

#include <memory>
#include <string>

#include <c10/core/Device.h>

#include "core/config.h"
#include "dist/communicator.h"

namespace dspine::dist {

struct RankLayout {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // index among the ranks of this host
  int local_world_size = 1;  // ranks on this host
};

// From MPI when it is initialised (a singleton without mpirun is a world of one; the first call
// must come from every rank: the local ranks come from a collective split, which MpiContext
// makes at start-up; later calls reuse it); otherwise from the
// launcher's environment (torchrun's RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE, then
// OpenMPI's OMPI_COMM_WORLD_*), or a world of one.
RankLayout rank_layout();

// The device this rank trains on for training.device `choice`: cuda means GPU `local_rank`; auto
// is that GPU when CUDA devices are visible, else the CPU.
c10::Device training_device(core::Device choice, int local_rank);

// The run's communicator: distributed.backend auto picks NCCL when `device` is CUDA and MPI
// otherwise; a world of one gets the single-process communicator. Collectives that do not
// finish within distributed.timeout_s end every rank with a message naming the rank and the
// collective.
std::shared_ptr<Communicator> make_communicator(const core::DistributedConfig& config,
                                                const c10::Device& device);

}  // namespace dspine::dist
