// Safetensors checkpoints: the header, mmap of the data, and the shard index (architecture.md §2.1).
//
// A checkpoint folder holds either `model.safetensors` or `model.safetensors.index.json` plus its
// shards. Every file is memory-mapped read-only; tensors point into the mapping (no copies). All
// header fields are untrusted: offsets, sizes and dtypes are checked against the file before any
// byte is read, and each error names the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace dsv4::model {

enum class DType { BF16, F16, F32, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3, F8_E5M2, F8_E8M0 };

const char* to_string(DType dtype);
size_t dtype_size(DType dtype);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // inside the file mapping; not necessarily aligned
  size_t nbytes = 0;
  std::string file;  // file name, for messages

  int64_t numel() const;
  std::string shape_string() const;  // "[4096, 1024]"
};

// A read-only memory mapping of one file.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// One tensor to write: `fill` writes its nbytes (numel · dtype size) into the buffer it is given.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::function<void(uint8_t* dst, size_t nbytes)> fill;
};

// Writes a safetensors file with the tensors in the given order, one tensor in memory at a time.
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

class Checkpoint {
 public:
  // Opens DIR (index or single file). Throws dsv4::Error naming the file/tensor on bad input.
  static Checkpoint open(const std::string& dir);

  // Tensors already in host memory (synthetic weights): `tensors` point into `storage`, which the
  // checkpoint keeps alive. `dir` names it in messages.
  static Checkpoint from_memory(std::string dir, std::vector<TensorInfo> tensors, std::shared_ptr<const uint8_t[]> storage);

  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  size_t total_bytes() const;
  const std::string& dir() const { return dir_; }

 private:
  void add_file(const std::string& path);

  std::string dir_;
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::shared_ptr<const uint8_t[]> memory_;  // from_memory's storage
  std::map<std::string, TensorInfo> tensors_;
};

}  // namespace dsv4::model
