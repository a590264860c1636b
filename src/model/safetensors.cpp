#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"

namespace dsv4::model {

namespace fs = std::filesystem;
using nlohmann::json;

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
    case DType::F8_E8M0: return "F8_E8M0";
  }
  return "?";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: case DType::I16: return 2;
    default: return 1;
  }
}

static bool parse_dtype(const std::string& s, DType& out) {
  static const std::map<std::string, DType> names = {
      {"BF16", DType::BF16}, {"F16", DType::F16}, {"F32", DType::F32}, {"F64", DType::F64},
      {"I64", DType::I64}, {"I32", DType::I32}, {"I16", DType::I16}, {"I8", DType::I8},
      {"U8", DType::U8}, {"BOOL", DType::BOOL}, {"F8_E4M3", DType::F8_E4M3},
      {"F8_E5M2", DType::F8_E5M2}, {"F8_E8M0", DType::F8_E8M0}};
  auto it = names.find(s);
  if (it == names.end()) return false;
  out = it->second;
  return true;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(ErrorCode::not_found, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(ErrorCode::invalid_input, "{}: cannot stat: {}", path, std::strerror(errno));
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail(ErrorCode::invalid_input, "{}: cannot mmap: {}", path, std::strerror(errno));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

// Reads one safetensors file: 8-byte little-endian header length, JSON header, data section.
void Checkpoint::add_file(const std::string& path) {
  auto file = std::make_unique<MappedFile>(path);
  const std::string name = fs::path(path).filename().string();
  if (file->size() < 8) fail(ErrorCode::invalid_input, "{}: truncated: {} bytes, no header", name, file->size());
  uint64_t header_len = 0;
  std::memcpy(&header_len, file->data(), 8);
  if (header_len > file->size() - 8)
    fail(ErrorCode::invalid_input, "{}: header length {} overruns the file ({} bytes): truncated shard?",
         name, header_len, file->size());
  json header;
  try {
    header = json::parse(file->data() + 8, file->data() + 8 + header_len);
  } catch (const json::parse_error& e) {
    fail(ErrorCode::invalid_input, "{}: malformed header JSON: {}", name, e.what());
  }
  if (!header.is_object()) fail(ErrorCode::invalid_input, "{}: header is not a JSON object", name);
  const uint8_t* data_start = file->data() + 8 + header_len;
  const size_t data_size = file->size() - 8 - header_len;

  for (auto& [tname, entry] : header.items()) {
    if (tname == "__metadata__") continue;
    const std::string where = name + ": " + tname;
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets"))
      fail(ErrorCode::invalid_input, "{}: header entry needs dtype, shape and data_offsets", where);
    TensorInfo t;
    t.name = tname;
    t.file = name;
    if (!entry["dtype"].is_string() || !parse_dtype(entry["dtype"].get<std::string>(), t.dtype))
      fail(ErrorCode::unsupported, "{}: unknown dtype {}", where, entry["dtype"].dump());
    const json& shape = entry["shape"];
    const json& offsets = entry["data_offsets"];
    if (!shape.is_array()) fail(ErrorCode::invalid_input, "{}: shape is not an array", where);
    uint64_t numel = 1;
    for (const json& d : shape) {
      if (!d.is_number_unsigned()) fail(ErrorCode::invalid_input, "{}: bad shape {}", where, shape.dump());
      const uint64_t v = d.get<uint64_t>();
      if (v != 0 && numel > (uint64_t(1) << 62) / v) fail(ErrorCode::invalid_input, "{}: shape {} overflows", where, shape.dump());
      numel *= v;
      t.shape.push_back(int64_t(v));
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      fail(ErrorCode::invalid_input, "{}: data_offsets must be [begin, end]", where);
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size)
      fail(ErrorCode::invalid_input, "{}: data_offsets [{}, {}] overrun the data section ({} bytes): truncated shard?",
           where, begin, end, data_size);
    if (end - begin != numel * dtype_size(t.dtype))
      fail(ErrorCode::invalid_input, "{}: {} bytes for {} {} (expected {})", where, end - begin,
           to_string(t.dtype), t.shape_string(), numel * dtype_size(t.dtype));
    t.data = data_start + begin;
    t.nbytes = end - begin;
    if (tensors_.count(tname))
      fail(ErrorCode::invalid_input, "{}: tensor also in {}", where, tensors_[tname].file);
    tensors_.emplace(tname, std::move(t));
  }
  files_.push_back(std::move(file));
}

static json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCode::not_found, "{}: cannot open", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::parse_error& e) {
    fail(ErrorCode::invalid_input, "{}: malformed JSON: {}", path.string(), e.what());
  }
}

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint ck;
  ck.dir_ = dir;
  const fs::path root(dir);
  const fs::path index_path = root / "model.safetensors.index.json";
  const fs::path single_path = root / "model.safetensors";
  if (fs::exists(index_path)) {
    const json index = read_json_file(index_path);
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      fail(ErrorCode::invalid_input, "{}: missing object 'weight_map'", index_path.string());
    std::set<std::string> shards;
    for (auto& [tname, shard] : index["weight_map"].items()) {
      if (!shard.is_string()) fail(ErrorCode::invalid_input, "{}: weight_map.{} is not a file name", index_path.string(), tname);
      const std::string s = shard.get<std::string>();
      if (s.find('/') != std::string::npos || s.find("..") != std::string::npos)
        fail(ErrorCode::invalid_input, "{}: weight_map.{}: shard name '{}' leaves the folder", index_path.string(), tname, s);
      shards.insert(s);
    }
    for (const std::string& shard : shards) ck.add_file((root / shard).string());
    // The index and the shards must agree tensor by tensor.
    for (auto& [tname, shard] : index["weight_map"].items()) {
      const TensorInfo* t = ck.find(tname);
      if (!t) fail(ErrorCode::invalid_input, "{}: {}: listed in the index but not in the shard", shard.get<std::string>(), tname);
      if (t->file != shard.get<std::string>())
        fail(ErrorCode::invalid_input, "{}: {}: index says {}", t->file, tname, shard.get<std::string>());
    }
    for (auto& [tname, t] : ck.tensors_)
      if (!index["weight_map"].contains(tname))
        fail(ErrorCode::invalid_input, "{}: {}: not listed in model.safetensors.index.json", t.file, tname);
  } else if (fs::exists(single_path)) {
    ck.add_file(single_path.string());
  } else {
    fail(ErrorCode::not_found, "{}: no model.safetensors.index.json or model.safetensors", dir);
  }
  return ck;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  std::vector<uint64_t> sizes;
  for (const TensorToWrite& t : tensors) {
    uint64_t n = dtype_size(t.dtype);
    for (int64_t d : t.shape) n *= uint64_t(d);
    header[t.name] = {{"dtype", to_string(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
    sizes.push_back(n);
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';  // keeps the data section 8-byte aligned
  std::ofstream f(path, std::ios::binary);
  if (!f) fail(ErrorCode::invalid_input, "{}: cannot write", path);
  const uint64_t header_len = h.size();
  f.write(reinterpret_cast<const char*>(&header_len), 8);
  f.write(h.data(), std::streamsize(h.size()));
  std::vector<uint8_t> buffer;
  for (size_t i = 0; i < tensors.size(); ++i) {
    buffer.assign(sizes[i], 0);
    tensors[i].fill(buffer.data(), buffer.size());
    f.write(reinterpret_cast<const char*>(buffer.data()), std::streamsize(buffer.size()));
  }
  if (!f) fail(ErrorCode::invalid_input, "{}: write failed", path);
}

Checkpoint Checkpoint::from_memory(std::string dir, std::vector<TensorInfo> tensors,
                                   std::shared_ptr<const uint8_t[]> storage) {
  Checkpoint ck;
  ck.dir_ = std::move(dir);
  ck.memory_ = std::move(storage);
  for (TensorInfo& t : tensors) {
    if (ck.tensors_.count(t.name)) fail(ErrorCode::internal, "{}: tensor {} given twice", ck.dir_, t.name);
    std::string name = t.name;
    ck.tensors_.emplace(std::move(name), std::move(t));
  }
  return ck;
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

size_t Checkpoint::total_bytes() const {
  size_t n = 0;
  for (auto& [_, t] : tensors_) n += t.nbytes;
  return n;
}

}  // namespace dsv4::model
