#include <filesystem>

#include "core/error.h"
#include "engine/engine.h"

namespace dsv4::engine {

std::unique_ptr<Model> Model::load(const std::string& dir) {
  if (!std::filesystem::is_directory(dir)) fail(ErrorCode::not_found, "{}: not a checkpoint folder", dir);
  return from_checkpoint(model::load_config(dir), model::Checkpoint::open(dir));
}

std::unique_ptr<Model> Model::from_checkpoint(model::ModelConfig config, model::Checkpoint checkpoint) {
  auto m = std::unique_ptr<Model>(new Model());
  m->config_ = std::move(config);
  m->checkpoint_ = std::move(checkpoint);
  m->weights_ = model::bind_weights(m->checkpoint_, m->config_);
  return m;
}

}  // namespace dsv4::engine
