#include "outer/status/documents.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "common/error.h"

namespace xloco::outer {

void to_json(nlohmann::json& j, const RoundRecord& r) {
  to_json(j, static_cast<const RoundFields&>(r));
  if (r.eval_loss) j["eval_loss"] = *r.eval_loss;
  if (r.eval_accuracy) j["eval_accuracy"] = *r.eval_accuracy;
  if (r.eval_skipped) j["eval_skipped"] = *r.eval_skipped;
  if (r.train_loss) j["train_loss"] = *r.train_loss;
}

void from_json(const nlohmann::json& j, RoundRecord& r) {
  from_json(j, static_cast<RoundFields&>(r));
  r.eval_loss = j.value("eval_loss", nlohmann::json()).get<std::optional<double>>();
  r.eval_accuracy = j.value("eval_accuracy", nlohmann::json()).get<std::optional<double>>();
  r.eval_skipped = j.value("eval_skipped", nlohmann::json()).get<std::optional<std::string>>();
  r.train_loss = j.value("train_loss", nlohmann::json()).get<std::optional<double>>();
}

HistoryPoint history_point(const RoundRecord& r) {
  HistoryPoint h;
  h.round = r.round;
  h.tokens = r.tokens;
  h.participants = r.participants;
  h.bytes_up = r.bytes_up;
  h.bytes_down = r.bytes_down;
  h.round_wall_s = r.round_wall_s;
  h.compute_s = r.compute_s;
  h.utilization = r.round_wall_s > 0 ? std::clamp(r.compute_s / r.round_wall_s, 0.0, 1.0) : 0.0;
  h.eval_loss = r.eval_loss;
  h.train_loss = r.train_loss;
  return h;
}

std::vector<BaselinePoint> read_baseline(const std::string& path) {
  std::ifstream in(path);
  XLOCO_ENFORCE(in.good(), common::IoError,
                "--baseline {}: cannot open it (the metrics JSONL of an `xloco train` run, e.g. "
                "runs/NAME/metrics/provider-0.jsonl)", path);
  std::vector<BaselinePoint> out;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    XLOCO_ENFORCE(!j.is_discarded() && j.is_object(), common::IoError,
                  "--baseline {}: line {} is not a JSON object", path, n);
    if (!j.contains("eval_loss")) continue;  // step lines
    XLOCO_ENFORCE(j["eval_loss"].is_number() && j.contains("step") && j["step"].is_number_integer(),
                  common::IoError, "--baseline {}: line {} has eval_loss without an integer step",
                  path, n);
    const double loss = j["eval_loss"].get<double>();
    XLOCO_ENFORCE(std::isfinite(loss), common::IoError, "--baseline {}: line {}: eval_loss is not finite",
                  path, n);
    out.push_back({j["step"].get<int64_t>(), loss});
  }
  XLOCO_ENFORCE(!out.empty(), common::IoError, "--baseline {}: no eval_loss lines in it", path);
  return out;
}

template <typename T>
T read_document(const std::string& path) {
  std::ifstream in(path);
  XLOCO_ENFORCE(in.good(), common::IoError, "cannot open {}", path);
  const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  XLOCO_ENFORCE(!j.is_discarded() && j.is_object(), common::IoError, "{} is not a JSON object",
                path);
  try {
    return j.get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw common::IoError(fmt::format("{}: {}", path, e.what()));
  }
}
template HeadStatus read_document<HeadStatus>(const std::string&);
template RunSummary read_document<RunSummary>(const std::string&);
template HeadCheckpointState read_document<HeadCheckpointState>(const std::string&);

std::vector<RoundRecord> read_round_records(const std::string& path) {
  std::vector<RoundRecord> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) continue;
    out.push_back(j.get<RoundRecord>());
  }
  return out;
}

}  // namespace xloco::outer
