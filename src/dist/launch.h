// Where this process sits in the job and which communicator it uses. mpirun gives rank, world
// size and local rank (rank among the processes of one host); each rank drives GPU = local rank.
#pragma once

#include <memory>

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

// From MPI when it is initialised (a singleton without mpirun is a world of one); otherwise
// from the launcher's environment, or a world of one.
RankLayout rank_layout();

// training.device for this rank: auto|cpu|cuda; CUDA means GPU = local rank.
c10::Device training_device(const std::string& choice, int local_rank);

// The run's communicator: distributed.backend auto picks NCCL when `device` is CUDA and MPI
// otherwise; a world of one gets the single-process communicator. Collectives that do not
// finish within distributed.timeout_s end every rank with a message naming the rank and the
// collective.
std::shared_ptr<Communicator> make_communicator(const core::DistributedConfig& config,
                                                const c10::Device& device);

}  // namespace dspine::dist
