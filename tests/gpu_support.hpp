// GPU-side helpers for the kernel tests: device buffers, strided uploads and
// downloads, and a simple reference attention kernel (one CTA per query row,
// fp32) that is itself checked against the float64 CPU reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "driver.hpp"
#include "reference.hpp"

namespace jitattn::test {

// Makes device 0's primary context current on this thread (as the CUDA
// runtime would). Returns false with a reason when there is no usable GPU.
bool use_gpu(std::string* why);

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return reinterpret_cast<void*>(pointer_); }
  size_t bytes() const { return bytes_; }
  void fill_bytes(unsigned char value);  // e.g. 0xff: NaN poison in every float format
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;

 private:
  CUdeviceptr pointer_ = 0;
  size_t bytes_ = 0;
};

// A [batch, seqlen, heads, head_dim] 16-bit tensor in device memory with
// arbitrary strides (elements). `values` is the logical contiguous content.
struct DeviceTensor {
  DeviceTensor(const std::vector<float>& values, DType dtype, const int64_t (&shape)[4], const int64_t (&strides)[4]);
  // Uninitialized-then-poisoned tensor (every byte 0xff).
  DeviceTensor(DType dtype, const int64_t (&shape)[4], const int64_t (&strides)[4]);
  TensorView view() const;
  std::vector<float> read() const;  // logical contiguous content as floats
  std::vector<uint16_t> raw() const;  // the whole allocation, bits as stored

  DType dtype;
  int64_t shape[4];
  int64_t strides[4];
  DeviceBuffer buffer;
};

// Strides that are not the contiguous default: padded rows, heads and batches.
void padded_strides(const int64_t (&shape)[4], int64_t (&strides)[4]);
// [batch, heads, seqlen, head_dim] storage viewed as [batch, seqlen, heads, head_dim].
void heads_major_strides(const int64_t (&shape)[4], int64_t (&strides)[4]);
void contiguous_strides(const int64_t (&shape)[4], int64_t (&strides)[4]);

// The reference kernel: `exact` computes in fp32 with no rounding of
// intermediates; otherwise it rounds like attention_16bit.
ReferenceOutput gpu_reference(const AttentionShape& shape, const DeviceTensor& q, const DeviceTensor& k,
                              const DeviceTensor& v, bool exact);

}  // namespace jitattn::test
