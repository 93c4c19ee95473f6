// A provider leader's own durable state (leader_rules.h SavedProviderState): its AdamW moments
// and uplink residual right after round r's contribution, atomically in
// RUN/providers/NAME/state/round-R (common/checkpoint.h: manifest, fsync, rename; the newest
// one kept), and at the join the newest one judged against the head's θ_pub and loaded. A
// failed write (a full disk) is reported and retried next round, never fatal: the worst a
// restart then loses is what it would have lost without it.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <future>
#include <string>

#include "common/config.h"
#include "common/log_limit.h"
#include "compress/encoder.h"
#include "inner/trainer.h"
#include "outer/provider/provider.h"
#include "outer/provider/provider_leader.h"

namespace xloco::outer {

class SavedStateStore {
 public:
  SavedStateStore(const common::Config& cfg, const ProviderOptions& opts) : cfg_(cfg), opts_(opts) {}
  ~SavedStateStore() { wait(); }
  SavedStateStore(const SavedStateStore&) = delete;
  SavedStateStore& operator=(const SavedStateStore&) = delete;

  // Round r's state, on a thread of its own. The blobs borrow the trainer's moments and the
  // uplink's residuals: nothing may touch them until wait() (the next round's training, a
  // fresh AdamW state, the end of the run) unless `copy`, when it writes copies instead (3 ×
  // the parameters in host memory while the write runs) and the caller need not wait.
  void save(uint64_t r, const std::string& base_hash, inner::InnerTrainer& trainer,
            compress::Encoder& uplink, int shard, bool copy);
  // Joins a save in flight; the seconds it waited.
  double wait();
  double last_save_s() const { return last_save_s_.load(); }  // the last save's own time

  // At the join: the newest saved state judged against the θ_pub the head sent
  // (judge_saved_state, by `theta_pub_hash` and lead's round) and loaded into the trainer's
  // moments and the uplink's residuals, or why not said; false when nothing was loaded. A
  // state directory that cannot be written turns saving off, with a warning.
  bool load(inner::InnerTrainer& trainer, Leader& lead, const std::string& theta_pub_hash);

 private:
  std::filesystem::path root() const { return std::filesystem::path(opts_.run_dir) / "state"; }

  const common::Config& cfg_;
  const ProviderOptions& opts_;
  bool enabled_ = true;
  std::future<void> saving_;
  std::atomic<double> last_save_s_{0};  // written by the save's thread
  uint64_t save_failures_ = 0;
  common::LogLimiter save_log_;
};

}  // namespace xloco::outer
