#include <filesystem>

#include "core/error.h"
#include "engine/engine.h"

namespace dsv4::engine {

std::unique_ptr<Model> Model::load(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) fail(ErrorCode::not_found, "{}: not a checkpoint folder", dir);
  auto m = std::unique_ptr<Model>(new Model());
  m->config_ = model::load_config(dir);
  m->checkpoint_ = model::Checkpoint::open(dir);
  m->weights_ = model::bind_weights(m->checkpoint_, m->config_);
  return m;
}

}  // namespace dsv4::engine
