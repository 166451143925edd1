// EngineConfig from a TOML file (configs/default.toml documents every key), and the checks every
// EngineConfig passes before anything loads.
#include "runtime/api/config.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <sstream>

#include <toml++/toml.h>

#include "runtime/base/check.h"
#include "runtime/base/mapped_file.h"
#include "runtime/engine/device.h"
#include "runtime/engine/settings.h"
#include "specrun/settings.hpp"

namespace specrun {
namespace {

constexpr int64_t kMaxBatch = 4096;    // far past what one step can batch usefully on any device
constexpr int64_t kMaxThreads = 4096;  // CPU threads

// Reads the keys of one table, each into a typed field, with errors that name file, line and key.
class TableReader {
 public:
  TableReader(const std::filesystem::path& path, const toml::table& table, std::string name,
              const std::filesystem::path& model_root = {})
      : path_(path), table_(table), name_(std::move(name)), model_root_(model_root) {}

  [[noreturn]] void fail(const toml::node& node, const std::string& key,
                         const std::string& what) const {
    std::ostringstream message;
    message << path_.string() << ":" << node.source().begin.line << ": key '" << name_ << "." << key
            << "' " << what;
    throw Error(message.str());
  }

  template <typename Integer>
  void integer(const std::string& key, Integer* field, int64_t minimum, int64_t maximum) {
    const toml::node* node = table_.get(key);
    if (node == nullptr) return;
    if (!node->is_integer()) fail(*node, key, "must be an integer");
    const int64_t value = node->as_integer()->get();
    if (value < minimum || value > maximum) {
      fail(*node, key,
           "must be in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "], got " +
               std::to_string(value));
    }
    *field = static_cast<Integer>(value);
  }

  template <typename Real>
  void number(const std::string& key, Real* field, double minimum, double maximum,
              bool exclusive_minimum, const std::string& range) {
    const toml::node* node = table_.get(key);
    if (node == nullptr) return;
    if (!node->is_number()) fail(*node, key, "must be a number");
    const double value = node->is_integer() ? static_cast<double>(node->as_integer()->get())
                                            : node->as_floating_point()->get();
    // The range is checked on the float the field stores: 1e-50 is above 0 as a double but
    // rounds to 0 as a float, which must fail here, with the file and line, not later.
    const auto stored = static_cast<Real>(value);
    const double checked = static_cast<double>(stored);
    const bool too_small = exclusive_minimum ? !(checked > minimum) : !(checked >= minimum);
    if (too_small || !(checked <= maximum)) {
      std::ostringstream text;
      text << "must be " << range << ", got " << value;
      if (checked != value) text << " (" << stored << " as a 32-bit float)";
      fail(*node, key, text.str());
    }
    *field = stored;
  }

  // One of the names `parse` knows (settings.h), into an enum field.
  template <typename Enum, typename Parse>
  void choice(const std::string& key, Enum* field, Parse parse, std::span<const Enum> allowed) {
    const toml::node* node = table_.get(key);
    if (node == nullptr) return;
    if (!node->is_string()) fail(*node, key, "must be a string");
    const std::string value = node->as_string()->get();
    if (const std::optional<Enum> parsed = parse(value)) {
      *field = *parsed;
      return;
    }
    std::string choices;
    for (const Enum option : allowed) {
      choices += (choices.empty() ? "" : ", ") + std::string(to_string(option));
    }
    fail(*node, key, "must be one of " + choices + ", got '" + value + "'");
  }

  void string(const std::string& key, std::string* field) {
    const toml::node* node = table_.get(key);
    if (node == nullptr) return;
    if (!node->is_string()) fail(*node, key, "must be a string");
    *field = node->as_string()->get();
  }

  void boolean(const std::string& key, bool* field) {
    const toml::node* node = table_.get(key);
    if (node == nullptr) return;
    if (!node->is_boolean()) fail(*node, key, "must be true or false");
    *field = node->as_boolean()->get();
  }

  // "cpu", "cuda" or "cuda:N" (whether this build and machine have it is checked at load).
  void device(const std::string& key, std::string* field) {
    const toml::node* node = table_.get(key);
    if (node == nullptr) return;
    if (!node->is_string()) fail(*node, key, "must be a string");
    const std::string value = node->as_string()->get();
    try {
      parse_device(value);
    } catch (const Error&) {
      fail(*node, key, "must be cpu, cuda or cuda:N, got '" + value + "'");
    }
    *field = value;
  }

  // A path, relative ones resolved against the directory of the file that names them (a config
  // beside its models keeps working from any working directory); "" stays "" (none).
  void path(const std::string& key, std::string* field) {
    const toml::node* node = table_.get(key);
    if (node == nullptr) return;
    if (!node->is_string()) fail(*node, key, "must be a string");
    const std::filesystem::path value(node->as_string()->get());
    *field = value.empty() || value.is_absolute()
                 ? value.string()
                 : (path_.parent_path() / value).lexically_normal().string();
    if (!field->empty() && !model_root_.empty() && !within(model_root_, *field)) {
      fail(*node, key, "names a path outside " + model_root_.string());
    }
  }

  // The table's keys, each by its row (specrun/settings.hpp); any other key is an
  // error that lists them.
  template <typename Settings>
  void settings(std::span<const Setting<Settings>> rows, Settings* settings) {
    for (const auto& [key, node] : table_) {
      if (find_setting(rows, key.str()) == nullptr) {
        fail(node, std::string(key.str()), "is not a known key (" + setting_keys(rows) + ")");
      }
    }
    for (const Setting<Settings>& row : rows) {
      const toml::node* node = table_.get(row.key);
      if (node == nullptr) continue;
      SettingValue value;
      switch (row.range.kind) {
        case SettingKind::kInteger:
          if (!node->is_integer()) fail(*node, row.key, "must be an integer");
          value = node->as_integer()->get();
          break;
        case SettingKind::kNumber:
          if (!node->is_number()) fail(*node, row.key, "must be a number");
          value = node->is_integer() ? static_cast<double>(node->as_integer()->get())
                                     : node->as_floating_point()->get();
          break;
        case SettingKind::kChoice:
          if (!node->is_string()) fail(*node, row.key, "must be a string");
          value = node->as_string()->get();
          break;
      }
      if (const std::optional<std::string> problem = setting_problem(row.range, value)) {
        fail(*node, row.key, *problem);
      }
      row.set(*settings, value);
    }
  }

  // Every key must be one this reader knows.
  void reject_unknown(std::initializer_list<const char*> known) const {
    for (const auto& [key, node] : table_) {
      bool found = false;
      for (const char* name : known) found = found || key.str() == name;
      if (!found) fail(node, std::string(key.str()), "is not a known key");
    }
  }

 private:
  // Whether `path`, with its symbolic links and ".." resolved as far as it exists, lies under
  // `root` (resolved the same way).
  static bool within(const std::filesystem::path& root, const std::filesystem::path& path) {
    std::error_code error;
    const std::filesystem::path base = std::filesystem::weakly_canonical(root, error);
    if (error) return false;
    const std::filesystem::path resolved = std::filesystem::weakly_canonical(path, error);
    if (error) return false;
    const auto [base_end, unused] =
        std::mismatch(base.begin(), base.end(), resolved.begin(), resolved.end());
    return base_end == base.end();
  }

  const std::filesystem::path& path_;
  const toml::table& table_;
  std::string name_;
  std::filesystem::path model_root_;  // model paths must stay under it; empty: anywhere
};

// The text of a settings file, which must be a regular file: a FIFO would block the read and a
// directory or device would read as an empty file.
MappedFile settings_file(const std::string& file) {
  const std::filesystem::path path(file);
  std::error_code status;
  if (!std::filesystem::exists(path, status)) throw Error(file + ": no such settings file");
  if (!std::filesystem::is_regular_file(path, status)) {
    throw Error(file + ": not a regular file (settings are read from a plain TOML file)");
  }
  return MappedFile(path);
}

// `text` parsed as TOML; a syntax error names the file and line.
toml::table parse_settings(std::string_view text, const std::filesystem::path& path) {
  try {
    return toml::parse(text, path.string());
  } catch (const toml::parse_error& error) {
    std::ostringstream message;
    message << path.string() << ":" << error.source().begin.line << ": " << error.description();
    throw Error(message.str());
  }
}

}  // namespace

EngineConfig EngineConfig::from_toml(const std::string& file, const std::string& model_root) {
  const MappedFile mapped = settings_file(file);
  return engine_config_from_toml_text(mapped.text(), file, model_root);
}

EngineConfig engine_config_from_toml_text(std::string_view text, const std::filesystem::path& path,
                                          const std::string& model_root) {
  const toml::table document = parse_settings(text, path);
  EngineConfig config;
  for (const auto& [key, node] : document) {
    const std::string name(key.str());
    if (name != "model" && name != "speculative" && name != "sampling" && name != "runtime" &&
        name != "server") {
      std::ostringstream message;
      message << path.string() << ":" << node.source().begin.line << ": '" << name
              << "' is not a known table (model, speculative, sampling, runtime, server)";
      throw Error(message.str());
    }
    if (!node.is_table()) {
      std::ostringstream message;
      message << path.string() << ":" << node.source().begin.line << ": '" << name
              << "' must be a table";
      throw Error(message.str());
    }
  }
  if (const toml::table* model = document["model"].as_table()) {
    TableReader reader(path, *model, "model", model_root);
    reader.reject_unknown({"target", "draft", "quantize", "draft_quantize", "quantize_lm_head"});
    reader.path("target", &config.target);
    reader.path("draft", &config.draft);
    reader.choice("quantize", &config.quantize, parse_quantization, quantizations());
    reader.choice("draft_quantize", &config.draft_quantize, parse_quantization, quantizations());
    reader.boolean("quantize_lm_head", &config.quantize_lm_head);
  }
  if (const toml::table* speculative = document["speculative"].as_table()) {
    TableReader reader(path, *speculative, "speculative");
    SpeculationSettings& s = config.speculation;
    reader.settings(speculation_settings(), &s);
    // Relations between keys: named by the first key of the table, whose line locates it.
    try {
      validate(s);
    } catch (const Error& error) {
      std::ostringstream message;
      message << path.string() << ":" << speculative->source().begin.line << ": [speculative] "
              << error.what();
      throw Error(message.str());
    }
  }
  if (const toml::table* sampling = document["sampling"].as_table()) {
    TableReader reader(path, *sampling, "sampling");
    reader.settings(sampling_settings(), &config.sampling);
  }
  if (const toml::table* runtime = document["runtime"].as_table()) {
    TableReader reader(path, *runtime, "runtime");
    reader.reject_unknown({"device", "threads", "kv_cache_tokens", "kv_block_size",
                           "kv_cache_dtype", "max_batch", "deterministic", "activations",
                           "prefix_cache", "overlap_drafting"});
    reader.device("device", &config.device);
    reader.integer("threads", &config.threads, 0, kMaxThreads);
    reader.integer("kv_cache_tokens", &config.kv_cache_tokens, 0,
                   std::numeric_limits<int32_t>::max());
    reader.integer("kv_block_size", &config.kv_block_size, 1, 4096);
    reader.choice("kv_cache_dtype", &config.kv_cache_dtype, parse_kv_cache_dtype,
                  kv_cache_dtypes());
    reader.integer("max_batch", &config.max_batch, 1, kMaxBatch);
    reader.boolean("deterministic", &config.deterministic);
    reader.choice("activations", &config.activations, parse_activation_precision,
                  activation_precisions());
    reader.boolean("prefix_cache", &config.prefix_cache);
    reader.choice("overlap_drafting", &config.overlap_drafting, parse_overlap_drafting,
                  overlap_draftings());
  }
  return config;
}

ServerConfig ServerConfig::from_toml(const std::string& file) {
  const MappedFile mapped = settings_file(file);
  return server_config_from_toml_text(mapped.text(), file);
}

ServerConfig server_config_from_toml_text(std::string_view text,
                                          const std::filesystem::path& path) {
  const toml::table document = parse_settings(text, path);
  ServerConfig config;
  const toml::node_view<const toml::node> node = document["server"];
  if (!node) return config;
  const toml::table* server = node.as_table();
  if (server == nullptr) {
    std::ostringstream message;
    message << path.string() << ":" << node.node()->source().begin.line
            << ": 'server' must be a table";
    throw Error(message.str());
  }
  TableReader reader(path, *server, "server");
  reader.reject_unknown({"host", "port", "model_name", "chat_template", "max_requests",
                         "max_body_bytes", "shutdown_grace_seconds"});
  reader.string("host", &config.host);
  reader.integer("port", &config.port, 0, 65535);
  reader.string("model_name", &config.model_name);
  reader.path("chat_template", &config.chat_template);
  reader.integer("max_requests", &config.max_requests, 1, 1 << 20);
  reader.integer("max_body_bytes", &config.max_body_bytes, 1024, int64_t{1} << 30);
  reader.number("shutdown_grace_seconds", &config.shutdown_grace_seconds, 0.0, 86400.0, false,
                "in [0, 86400]");
  return config;
}

std::optional<kernels::RopeStyle> parse_rope_style(const std::string& style) {
  if (style == "auto") return std::nullopt;
  if (style == "rotate-half") return kernels::RopeStyle::kRotateHalf;
  if (style == "interleaved") return kernels::RopeStyle::kInterleaved;
  throw Error("rope_style '" + style + "' is not one of auto, rotate-half, interleaved");
}

void validate(const EngineConfig& config) {
  if (config.target.empty()) throw Error("target is empty: name a checkpoint");
  try {
    validate(config.speculation);
  } catch (const Error& error) {
    throw Error(std::string("speculation: ") + error.what());
  }
  try {
    validate(config.sampling);
  } catch (const Error& error) {
    throw Error(std::string("sampling: ") + error.what());
  }
  if (config.threads < 0 || config.threads > kMaxThreads) {
    throw Error("threads must be in [0, " + std::to_string(kMaxThreads) + "], got " +
                std::to_string(config.threads));
  }
  if (config.kv_cache_tokens < 0) {
    throw Error("kv_cache_tokens must be >= 0, got " + std::to_string(config.kv_cache_tokens));
  }
  if (config.kv_block_size < 1) {
    throw Error("kv_block_size must be >= 1, got " + std::to_string(config.kv_block_size));
  }
  if (config.max_batch < 1 || config.max_batch > kMaxBatch) {
    throw Error("max_batch must be in [1, " + std::to_string(kMaxBatch) + "], got " +
                std::to_string(config.max_batch));
  }
  parse_device(config.device);
  parse_rope_style(config.rope_style);
}

}  // namespace specrun
