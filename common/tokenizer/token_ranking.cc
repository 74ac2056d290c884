#include "common/tokenizer/token_ranking.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status_macros.h"
#include "nlohmann/json.hpp"

namespace specd {
namespace {

absl::StatusOr<nlohmann::json> ReadJson(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), " is not JSON"));
  }
  return j;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> TokenizerRanking(const std::filesystem::path& dir,
                                                      int64_t vocab_size) {
  SPECD_ASSIGN_OR_RETURN(const nlohmann::json root, ReadJson(dir / "tokenizer.json"));
  std::vector<int32_t> order;
  std::vector<bool> placed(static_cast<size_t>(vocab_size), false);
  auto place = [&](int64_t id) {
    if (id < 0 || id >= vocab_size || placed[static_cast<size_t>(id)]) return;
    placed[static_cast<size_t>(id)] = true;
    order.push_back(static_cast<int32_t>(id));
  };
  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    for (const nlohmann::json& t : root["added_tokens"]) {
      if (t.is_object() && t.contains("id") && t["id"].is_number_integer()) {
        place(t["id"].get<int64_t>());
      }
    }
  }
  const nlohmann::json* model = root.contains("model") ? &root["model"] : nullptr;
  const std::string type =
      model != nullptr && model->contains("type") && (*model)["type"].is_string()
          ? (*model)["type"].get<std::string>()
          : "";
  if (type == "Unigram" && (*model)["vocab"].is_array()) {
    // [[piece, score], ...]: the id is the index.
    std::vector<std::pair<double, int32_t>> scored;
    const nlohmann::json& vocab = (*model)["vocab"];
    for (size_t id = 0; id < vocab.size(); ++id) {
      const double score = vocab[id].is_array() && vocab[id].size() == 2 && vocab[id][1].is_number()
                               ? vocab[id][1].get<double>()
                               : -1e300;
      scored.emplace_back(score, static_cast<int32_t>(id));
    }
    std::stable_sort(scored.begin(), scored.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    for (const auto& [score, id] : scored) place(id);
  } else if (model != nullptr && model->contains("vocab") && (*model)["vocab"].is_object()) {
    // BPE: a merged piece ranks with the merge that makes it; pieces no merge makes come first.
    absl::flat_hash_map<std::string, int64_t> id_of;
    for (auto it = (*model)["vocab"].begin(); it != (*model)["vocab"].end(); ++it) {
      if (it.value().is_number_integer()) id_of[it.key()] = it.value().get<int64_t>();
    }
    std::vector<std::string> merged;
    if (model->contains("merges") && (*model)["merges"].is_array()) {
      for (const nlohmann::json& m : (*model)["merges"]) {
        if (m.is_string()) {
          const std::string text = m.get<std::string>();
          const size_t space = text.find(' ');
          if (space != std::string::npos) {
            merged.push_back(text.substr(0, space) + text.substr(space + 1));
          }
        } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
          merged.push_back(m[0].get<std::string>() + m[1].get<std::string>());
        }
      }
    }
    absl::flat_hash_map<int64_t, bool> is_merged;
    for (const std::string& piece : merged) {
      if (const auto it = id_of.find(piece); it != id_of.end()) is_merged[it->second] = true;
    }
    for (int64_t id = 0; id < vocab_size; ++id) {
      if (!is_merged.contains(id)) place(id);
    }
    for (const std::string& piece : merged) {
      if (const auto it = id_of.find(piece); it != id_of.end()) place(it->second);
    }
  }
  for (int64_t id = 0; id < vocab_size; ++id) place(id);
  return order;
}

absl::StatusOr<std::vector<int64_t>> ReadTokenCounts(const std::filesystem::path& path,
                                                     int64_t vocab_size) {
  std::ifstream in(path);
  if (!in)
    return absl::NotFoundError(absl::StrCat("cannot read token frequencies ", path.string()));
  std::vector<int64_t> counts(static_cast<size_t>(vocab_size), 0);
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    const std::vector<std::string> parts = absl::StrSplit(line, '\t');
    int64_t id = -1;
    int64_t count = -1;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &id) ||
        !absl::SimpleAtoi(parts[1], &count) || id < 0 || id >= vocab_size || count < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path.string(), ":", n, ": expected \"TOKEN_ID<TAB>COUNT\" with an id in [0, ", vocab_size,
          ") and a count >= 0, got '", line, "'"));
    }
    counts[static_cast<size_t>(id)] += count;
  }
  return counts;
}

absl::Status WriteTokenCounts(const std::filesystem::path& path, const std::vector<int64_t>& counts,
                              const std::string& comment) {
  std::vector<int32_t> ids;
  for (size_t id = 0; id < counts.size(); ++id) {
    if (counts[id] > 0) ids.push_back(static_cast<int32_t>(id));
  }
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    return counts[static_cast<size_t>(a)] > counts[static_cast<size_t>(b)];
  });
  std::ofstream out(path);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path.string()));
  if (!comment.empty()) out << "# " << comment << "\n";
  for (const int32_t id : ids) out << id << "\t" << counts[static_cast<size_t>(id)] << "\n";
  if (!out) return absl::DataLossError(absl::StrCat("writing ", path.string(), " failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> SelectOutputVocab(const std::filesystem::path& model_dir,
                                                       int64_t vocab_size, int64_t n,
                                                       const std::filesystem::path& counts_file) {
  if (n < 1 || n > vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--draft-vocab must be in [1, ", vocab_size, "] (the vocabulary), got ", n));
  }
  SPECD_ASSIGN_OR_RETURN(std::vector<int32_t> order, TokenizerRanking(model_dir, vocab_size));
  if (!counts_file.empty()) {
    SPECD_ASSIGN_OR_RETURN(const std::vector<int64_t> counts,
                           ReadTokenCounts(counts_file, vocab_size));
    // Counted tokens first, most frequent first; the tokenizer's ranking settles ties.
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return counts[static_cast<size_t>(a)] > counts[static_cast<size_t>(b)];
    });
  }
  order.resize(static_cast<size_t>(n));
  std::sort(order.begin(), order.end());
  return order;
}

}  // namespace specd
