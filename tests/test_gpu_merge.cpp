// merge_states / merge_state and the combine kernels behind them, on a GPU,
// against a float64 CPU reference:
//   out_lse = log Σ_s exp(lse_s),  out = Σ_s exp(lse_s - out_lse) · state_s,
// out exactly 0 and out_lse -inf where every lse_s is -inf. Inputs are fresh
// random values every run (the seed is printed with every failure): LSEs
// spread over ±8 around a per-pair offset of up to ±100, with pairs whose
// every state is -inf and pairs where only some are. A state whose lse is
// -inf holds NaN: the kernel must not read it. Outputs are poisoned (every
// byte 0xff, NaN) before each run, so an unwritten element fails, and stride
// gaps must still hold the poison afterwards. Tolerances: fp32 out within
// 1e-5 of Σ_s w_s·|state_s| (the size of the terms summed), 16-bit out
// within half a unit in the last place of the exact value (one rounding) plus
// that, lse within 1e-5 · max(1, |lse|).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu_support.hpp"
#include "kernels.hpp"
#include "merge.hpp"

using namespace jitattn;
using namespace jitattn::test;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

size_t element_bytes(DType dtype) { return dtype == DType::f32 ? 4 : 2; }

const char* name_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    default: return "?";
  }
}

// Strides of a tensor of logical `shape` stored with its axes in `order`
// (outermost first) and every storage extent but the outermost enlarged by
// `pad` elements (gaps after each innermost row, each head, ...).
std::vector<int64_t> layout_strides(const std::vector<int64_t>& shape, const std::vector<int>& order, int64_t pad) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (int i = static_cast<int>(order.size()) - 1; i >= 0; --i) {
    strides[order[i]] = stride;
    stride *= std::max<int64_t>(1, shape[order[i]] + (i > 0 ? pad : 0));
  }
  return strides;
}

std::vector<int> identity_order(size_t n) {
  std::vector<int> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<int>(i);
  return order;
}

// A strided f32/f16/bf16 tensor of 1 to 4 dimensions in device memory; every
// byte not holding a value is 0xff.
class DeviceArray {
 public:
  DeviceArray(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides)
      : dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)), buffer_(span() * element_bytes(dtype)) {
    buffer_.fill_bytes(0xff);
  }

  // values: the logical row-major content.
  void upload(const std::vector<float>& values) {
    std::vector<uint8_t> image(buffer_.bytes(), 0xff);
    for_each([&](size_t logical, size_t offset) { encode(values[logical], image.data() + offset * element_bytes(dtype_)); });
    buffer_.upload(image.data(), image.size());
  }

  std::vector<float> read() const {
    const std::vector<uint8_t> image = raw();
    std::vector<float> values(count());
    for_each([&](size_t logical, size_t offset) { values[logical] = decode(image.data() + offset * element_bytes(dtype_)); });
    return values;
  }

  // Elements outside the tensor (stride gaps) that are no longer all 0xff.
  size_t written_outside() const {
    const std::vector<uint8_t> image = raw();
    const size_t bytes = element_bytes(dtype_);
    std::vector<bool> inside(image.size() / bytes, false);
    for_each([&](size_t, size_t offset) { inside[offset] = true; });
    size_t written = 0;
    for (size_t i = 0; i < inside.size(); ++i) {
      if (inside[i]) continue;
      bool poison = true;
      for (size_t b = 0; b < bytes; ++b) poison = poison && image[i * bytes + b] == 0xff;
      written += !poison;
    }
    return written;
  }

  TensorView view() const {
    TensorView t;
    t.data = buffer_.get();
    t.dtype = dtype_;
    t.ndim = static_cast<int>(shape_.size());
    for (int i = 0; i < t.ndim; ++i) {
      t.shape[i] = shape_[i];
      t.strides[i] = strides_[i];
    }
    return t;
  }

  size_t count() const {
    size_t n = 1;
    for (int64_t extent : shape_) n *= static_cast<size_t>(extent);
    return n;
  }
  void* data() const { return buffer_.get(); }
  void poison() { buffer_.fill_bytes(0xff); }

 private:
  size_t span() const {
    size_t last = 0;
    for (size_t axis = 0; axis < shape_.size(); ++axis) {
      if (shape_[axis] == 0) return 0;
      last += static_cast<size_t>(shape_[axis] - 1) * strides_[axis];
    }
    return last + 1;
  }
  std::vector<uint8_t> raw() const {
    std::vector<uint8_t> image(buffer_.bytes());
    buffer_.download(image.data(), image.size());
    return image;
  }
  template <typename Body>
  void for_each(Body&& body) const {
    const size_t n = shape_.size();
    std::vector<int64_t> index(n, 0);
    const size_t total = count();
    for (size_t logical = 0; logical < total; ++logical) {
      size_t offset = 0;
      for (size_t axis = 0; axis < n; ++axis) offset += static_cast<size_t>(index[axis] * strides_[axis]);
      body(logical, offset);
      for (size_t axis = n; axis-- > 0;) {
        if (++index[axis] < shape_[axis]) break;
        index[axis] = 0;
      }
    }
  }
  void encode(float value, uint8_t* out) const {
    if (dtype_ == DType::f32) {
      std::memcpy(out, &value, 4);
    } else {
      const uint16_t bits = from_float(value, dtype_);
      std::memcpy(out, &bits, 2);
    }
  }
  float decode(const uint8_t* in) const {
    if (dtype_ == DType::f32) {
      float value;
      std::memcpy(&value, in, 4);
      return value;
    }
    uint16_t bits;
    std::memcpy(&bits, in, 2);
    return to_float(bits, dtype_);
  }

  DType dtype_;
  std::vector<int64_t> shape_;
  std::vector<int64_t> strides_;
  DeviceBuffer buffer_;
};

// Logical inputs of one merge: states [N, rows, heads, D], lse [N, rows, heads].
struct States {
  int num_states = 0, rows = 0, heads = 0, head_dim = 0;
  std::vector<float> values;
  std::vector<float> lse;
  size_t empty_pairs = 0;    // every state -inf
  size_t partial_pairs = 0;  // some states -inf, not all
};

// Fresh random states (values rounded to `dtype`, as the kernel reads them).
// Pair 0 is empty, pair 1 partly empty (with two or more states); the rest
// are empty one time in six, partly empty two in six.
States random_states(int num_states, int rows, int heads, int head_dim, DType dtype, std::mt19937_64& rng) {
  States s;
  s.num_states = num_states, s.rows = rows, s.heads = heads, s.head_dim = head_dim;
  const size_t pairs = static_cast<size_t>(rows) * heads;
  s.lse.assign(static_cast<size_t>(num_states) * pairs, 0.f);
  s.values.assign(s.lse.size() * head_dim, 0.f);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> spread(-8.f, 8.f), offset_of(-100.f, 100.f), unit(0.f, 1.f);
  for (size_t pair = 0; pair < pairs; ++pair) {
    int mode = pair == 0 ? 0 : pair == 1 ? 1 : std::uniform_int_distribution<int>(0, 5)(rng);
    if (mode == 1 || mode == 2) mode = num_states >= 2 ? 1 : 3;  // 0 empty, 1 partly, else full
    const float offset = offset_of(rng);
    const int keep = std::uniform_int_distribution<int>(0, num_states - 1)(rng);
    const int drop = (keep + 1 + std::uniform_int_distribution<int>(0, std::max(0, num_states - 2))(rng)) % num_states;
    for (int st = 0; st < num_states; ++st) {
      bool empty = mode == 0;
      if (mode == 1) empty = st == drop || (st != keep && unit(rng) < 0.4f);
      const size_t index = static_cast<size_t>(st) * pairs + pair;
      s.lse[index] = empty ? kNegInf : offset + spread(rng);
      for (int d = 0; d < head_dim; ++d) {
        float value = normal(rng);
        if (dtype != DType::f32) value = round_to(value, dtype);
        s.values[index * head_dim + d] = empty ? std::nanf("") : value;  // must never be read
      }
    }
    s.empty_pairs += mode == 0;
    s.partial_pairs += mode == 1;
  }
  return s;
}

struct Expected {
  std::vector<double> out;        // [rows, heads, D]
  std::vector<double> magnitude;  // Σ_s w_s |state_s[d]|
  std::vector<double> lse;        // [rows, heads]
};

Expected reference(const States& s) {
  const size_t pairs = static_cast<size_t>(s.rows) * s.heads;
  Expected e;
  e.out.assign(pairs * s.head_dim, 0.0);
  e.magnitude.assign(e.out.size(), 0.0);
  e.lse.assign(pairs, -std::numeric_limits<double>::infinity());
  for (size_t pair = 0; pair < pairs; ++pair) {
    double max = -std::numeric_limits<double>::infinity();
    for (int st = 0; st < s.num_states; ++st) max = std::max(max, double(s.lse[st * pairs + pair]));
    if (std::isinf(max)) continue;
    double sum = 0;
    for (int st = 0; st < s.num_states; ++st) sum += std::exp(double(s.lse[st * pairs + pair]) - max);
    const double lse = max + std::log(sum);
    e.lse[pair] = lse;
    for (int st = 0; st < s.num_states; ++st) {
      const double l = s.lse[st * pairs + pair];
      if (std::isinf(l)) continue;
      const double w = std::exp(l - lse);
      const float* state = &s.values[(st * pairs + pair) * s.head_dim];
      for (int d = 0; d < s.head_dim; ++d) {
        e.out[pair * s.head_dim + d] += w * state[d];
        e.magnitude[pair * s.head_dim + d] += w * std::fabs(double(state[d]));
      }
    }
  }
  return e;
}

// Half a unit in the last place of x in a 16-bit dtype (normal range; f16
// subnormals have a fixed spacing of 2^-24).
double half_ulp(double x, DType dtype) {
  const int mantissa_bits = dtype == DType::bf16 ? 7 : 10;
  int exponent = std::ilogb(std::max(std::fabs(x), 1e-30));
  if (dtype == DType::f16) exponent = std::max(exponent, -14);
  return std::ldexp(0.5, exponent - mantissa_bits);
}

struct MergeVerdict {
  size_t out_off = 0, lse_off = 0, empty_not_zero = 0, outside = 0;
  double worst = 0;  // largest error / tolerance
  std::string first;
  bool ok() const { return out_off == 0 && lse_off == 0 && empty_not_zero == 0 && outside == 0; }
  std::string summary() const {
    return fmt::format("{} outputs off, {} lse off, {} empty pairs not 0/-inf, {} stride-gap elements written; worst "
                       "error {:.3g}× the tolerance; first: {}",
                       out_off, lse_off, empty_not_zero, outside, worst, first.empty() ? "-" : first);
  }
};

// out [rows, heads, D], lse [rows, heads] (empty: not given) against the reference.
MergeVerdict judge(const States& s, const Expected& e, DType out_dtype, const std::vector<float>& out,
              const std::vector<float>& lse, double relative) {
  MergeVerdict v;
  const size_t pairs = static_cast<size_t>(s.rows) * s.heads;
  for (size_t pair = 0; pair < pairs; ++pair) {
    const bool empty = std::isinf(e.lse[pair]);
    bool pair_zero = true;
    for (int d = 0; d < s.head_dim; ++d) {
      const size_t i = pair * s.head_dim + d;
      if (empty) {
        pair_zero = pair_zero && out[i] == 0.f;
        continue;
      }
      double tolerance = relative * e.magnitude[i];
      if (out_dtype != DType::f32) tolerance += half_ulp(e.out[i], out_dtype);
      const double error = std::fabs(double(out[i]) - e.out[i]);
      if (!(error <= tolerance)) {
        if (v.out_off++ == 0) {
          v.first = fmt::format("out[row {}, head {}, {}] = {} vs {} (tolerance {:.3g})", pair / s.heads,
                                pair % s.heads, d, out[i], e.out[i], tolerance);
        }
      }
      v.worst = std::max(v.worst, std::isnan(error) ? INFINITY : error / tolerance);
    }
    if (!lse.empty()) {
      const bool ok = empty ? (std::isinf(lse[pair]) && lse[pair] < 0)
                            : std::fabs(double(lse[pair]) - e.lse[pair]) <= 1e-5 * std::max(1.0, std::fabs(e.lse[pair]));
      if (!ok && v.lse_off++ == 0 && v.first.empty()) {
        v.first = fmt::format("lse[row {}, head {}] = {} vs {}", pair / s.heads, pair % s.heads, lse[pair], e.lse[pair]);
      }
    }
    if (empty && !pair_zero) {
      if (v.empty_not_zero++ == 0 && v.first.empty()) {
        v.first = fmt::format("empty pair (row {}, head {}) has out {}", pair / s.heads, pair % s.heads, out[pair * s.head_dim]);
      }
    }
  }
  return v;
}

// How the tensors of a merge_states case are stored.
// unaligned: padded by one element, so rows start off 16-byte boundaries
// (the elementwise kernel).
enum class Layout { contiguous, padded, permuted, unaligned };

const char* layout_name(Layout layout) {
  switch (layout) {
    case Layout::contiguous: return "contiguous";
    case Layout::padded: return "padded";
    case Layout::permuted: return "permuted";
    case Layout::unaligned: return "unaligned";
  }
  return "?";
}

struct Case {
  int num_states = 1, rows = 1, heads = 1, head_dim = 64;
  DType state_dtype = DType::f32, out_dtype = DType::f32;
  Layout layout = Layout::contiguous;
  bool with_lse = true;
};

std::string describe(const Case& c, uint64_t seed) {
  return fmt::format("combine.{}.{} states={} rows={} heads={} head_dim={} layout={} out_lse={} seed={}",
                     name_of(c.state_dtype), name_of(c.out_dtype), c.num_states, c.rows, c.heads, c.head_dim,
                     layout_name(c.layout), c.with_lse ? "yes" : "no", seed);
}

// states [N, rows, heads, D] stored [rows, heads, N, D] when permuted; lse
// [N, rows, heads] stored [heads, rows, N]; out [rows, heads, D] stored
// [heads, rows, D]; out_lse [rows, heads] stored [heads, rows].
struct Storage {
  std::vector<int> states_order, lse_order, out_order, out_lse_order;
  int64_t vector_pad = 0, scalar_pad = 0;
};

Storage storage_of(Layout layout) {
  Storage s{identity_order(4), identity_order(3), identity_order(3), identity_order(2), 0, 0};
  if (layout == Layout::padded) s.vector_pad = 8, s.scalar_pad = 3;
  if (layout == Layout::unaligned) s.vector_pad = 1, s.scalar_pad = 1;
  if (layout == Layout::permuted) {
    s.states_order = {1, 2, 0, 3};
    s.lse_order = {2, 1, 0};
    s.out_order = {1, 0, 2};
    s.out_lse_order = {1, 0};
    s.vector_pad = 8;
  }
  return s;
}

// One merge_states case: fresh inputs, poisoned outputs, the run, the verdict.
void check_merge_states(const Case& c, std::mt19937_64& rng, uint64_t seed, double relative = 1e-5) {
  const States s = random_states(c.num_states, c.rows, c.heads, c.head_dim, c.state_dtype, rng);
  const Expected e = reference(s);
  const Storage st = storage_of(c.layout);
  const std::vector<int64_t> states_shape = {c.num_states, c.rows, c.heads, c.head_dim};
  const std::vector<int64_t> lse_shape = {c.num_states, c.rows, c.heads};
  const std::vector<int64_t> out_shape = {c.rows, c.heads, c.head_dim};
  const std::vector<int64_t> out_lse_shape = {c.rows, c.heads};
  DeviceArray states(c.state_dtype, states_shape, layout_strides(states_shape, st.states_order, st.vector_pad));
  DeviceArray lse(DType::f32, lse_shape, layout_strides(lse_shape, st.lse_order, st.scalar_pad));
  DeviceArray out(c.out_dtype, out_shape, layout_strides(out_shape, st.out_order, st.vector_pad));
  DeviceArray out_lse(DType::f32, out_lse_shape, layout_strides(out_lse_shape, st.out_lse_order, st.scalar_pad));
  states.upload(s.values);
  lse.upload(s.lse);
  const TensorView out_lse_view = out_lse.view();
  try {
    gpu_tests_runtime().merge_states(states.view(), lse.view(), out.view(), c.with_lse ? &out_lse_view : nullptr);
  } catch (const std::exception& error) {
    FAIL_CHECK(fmt::format("{}: {}", describe(c, seed), error.what()));
    return;
  }
  MergeVerdict v = judge(s, e, c.out_dtype, out.read(), c.with_lse ? out_lse.read() : std::vector<float>(), relative);
  v.outside = out.written_outside() + out_lse.written_outside();
  if (!c.with_lse) {  // not passed: must still be poison
    const std::vector<float> untouched = out_lse.read();
    v.outside += std::count_if(untouched.begin(), untouched.end(), [](float x) { return !std::isnan(x); });
  }
  CHECK_MESSAGE(v.ok(), fmt::format("{}: {}", describe(c, seed), v.summary()));
  CHECK_MESSAGE(s.empty_pairs > 0, describe(c, seed));
  if (c.num_states >= 2) CHECK_MESSAGE(s.partial_pairs > 0, describe(c, seed));
}

const DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};

void warm_combine_specs() {
  std::vector<std::string> specs;
  for (bool elementwise : {false, true})
    for (DType state : kDTypes)
      for (DType out : kDTypes) specs.push_back(detail::KernelSpec::combine(state, out, elementwise).text());
  warm_or_fail(specs);
}

}  // namespace

// Two states of `s` (num_states 2) in separate device arrays: a contiguous;
// b with padded heads and rows; lse_a contiguous; lse_b stored [heads, rows].
// The LSEs uploaded are `lse` (s.lse, or a variant of it).
struct TwoStates {
  TwoStates(const States& s, DType dtype, const std::vector<float>& lse)
      : shape{s.rows, s.heads, s.head_dim},
        lse_shape{s.rows, s.heads},
        a(dtype, shape, layout_strides(shape, {0, 1, 2}, 0)),
        b(dtype, shape, layout_strides(shape, {0, 1, 2}, 8)),
        lse_a(DType::f32, lse_shape, layout_strides(lse_shape, {0, 1}, 0)),
        lse_b(DType::f32, lse_shape, layout_strides(lse_shape, {1, 0}, 1)) {
    const size_t half = lse.size() / 2;
    a.upload(std::vector<float>(s.values.begin(), s.values.begin() + half * s.head_dim));
    b.upload(std::vector<float>(s.values.begin() + half * s.head_dim, s.values.end()));
    lse_a.upload(std::vector<float>(lse.begin(), lse.begin() + half));
    lse_b.upload(std::vector<float>(lse.begin() + half, lse.end()));
  }
  std::vector<int64_t> shape, lse_shape;
  DeviceArray a, b, lse_a, lse_b;
};

TEST_SUITE("gpu merge") {

TEST_CASE("merge_states: 1 to 128 states × head dims 64/128/256/40 × every state and out dtype, three layouts") {
  warm_combine_specs();
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  int index = 0;
  for (int num_states : {1, 2, 3, 5, 17, 32, 55, 97, 128}) {
    for (int head_dim : {64, 128, 256, 40}) {
      for (DType state_dtype : kDTypes) {
        for (DType out_dtype : kDTypes) {
          Case c;
          c.num_states = num_states;
          c.head_dim = head_dim;
          c.state_dtype = state_dtype;
          c.out_dtype = out_dtype;
          c.rows = std::uniform_int_distribution<int>(2, 12)(rng);
          c.heads = std::uniform_int_distribution<int>(1, 5)(rng);
          c.layout = static_cast<Layout>(index % 3);
          c.with_lse = index % 7 != 6;
          check_merge_states(c, rng, seed);
          ++index;
        }
      }
    }
  }
}

TEST_CASE("merge_states: up to 1024 states, head dims 8 to 512") {
  warm_combine_specs();
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const int shapes[][2] = {{129, 128}, {300, 512}, {1000, 8}, {1024, 128}, {1024, 512}, {700, 72}, {64, 512}, {2, 8}};
  int index = 0;
  for (const auto& [num_states, head_dim] : shapes) {
    Case c;
    c.num_states = num_states;
    c.head_dim = head_dim;
    c.rows = 3;
    c.heads = 2;
    c.state_dtype = index % 2 == 0 ? DType::f32 : DType::bf16;
    c.out_dtype = index % 3 == 0 ? DType::f32 : DType::f16;
    c.layout = static_cast<Layout>(index % 3);
    // fp32 sums of up to 1024 terms: the rounding of the running sum grows with the count.
    check_merge_states(c, rng, seed, num_states > 128 ? 3e-5 : 1e-5);
    ++index;
  }
}

TEST_CASE("merge_states element by element: head dims that are not a multiple of 8, rows off 16-byte boundaries") {
  // The elementwise kernel: the last chunk of a row holds 1-7 elements, and
  // stores past it would land in the stride gaps, which must stay poison.
  warm_combine_specs();
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  int index = 0;
  for (int num_states : {1, 2, 5, 33, 130}) {
    for (int head_dim : {59, 111, 1, 3, 13, 509, 64}) {
      for (DType state_dtype : kDTypes) {
        Case c;
        c.num_states = num_states;
        c.head_dim = head_dim;
        c.state_dtype = state_dtype;
        c.out_dtype = kDTypes[(index + index / 3) % 3];
        c.rows = std::uniform_int_distribution<int>(2, 9)(rng);
        c.heads = std::uniform_int_distribution<int>(1, 4)(rng);
        // Head dim 64 only unaligned; the others in every layout.
        const Layout layouts[] = {Layout::unaligned, Layout::contiguous, Layout::padded, Layout::permuted};
        c.layout = head_dim == 64 ? Layout::unaligned : layouts[index % 4];
        c.with_lse = index % 5 != 4;
        check_merge_states(c, rng, seed, num_states > 128 ? 3e-5 : 1e-5);
        ++index;
      }
    }
  }
}

TEST_CASE("merge_state: two states in separate buffers with their own strides") {
  warm_combine_specs();
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  int index = 0;
  for (int head_dim : {64, 128, 256, 40, 59}) {  // 59: element by element
    for (DType state_dtype : kDTypes) {
      for (DType out_dtype : {DType::f32, DType::bf16, DType::f16}) {
        if (index++ % 2 == 1 && state_dtype != out_dtype) continue;  // every dtype still meets every head dim
        const int rows = std::uniform_int_distribution<int>(2, 40)(rng);
        const int heads = std::uniform_int_distribution<int>(1, 6)(rng);
        const States s = random_states(2, rows, heads, head_dim, state_dtype, rng);
        const Expected e = reference(s);
        TwoStates in(s, state_dtype, s.lse);
        // out stored [heads, rows, D].
        DeviceArray out(out_dtype, in.shape, layout_strides(in.shape, {1, 0, 2}, 0));
        DeviceArray out_lse(DType::f32, in.lse_shape, layout_strides(in.lse_shape, {0, 1}, 2));
        const TensorView out_lse_view = out_lse.view();
        const std::string what = fmt::format("merge_state {}→{} rows={} heads={} head_dim={} seed={}", name_of(state_dtype),
                                             name_of(out_dtype), rows, heads, head_dim, seed);
        try {
          gpu_tests_runtime().merge_state(in.a.view(), in.lse_a.view(), in.b.view(), in.lse_b.view(), out.view(),
                                          &out_lse_view);
        } catch (const std::exception& error) {
          FAIL_CHECK(fmt::format("{}: {}", what, error.what()));
          continue;
        }
        MergeVerdict v = judge(s, e, out_dtype, out.read(), out_lse.read(), 1e-5);
        v.outside = out.written_outside() + out_lse.written_outside();
        CHECK_MESSAGE(v.ok(), fmt::format("{}: {}", what, v.summary()));
      }
    }
  }
}

TEST_CASE("merge_state: an LSE of +inf (FlashAttention 2's empty row) is empty; merged in place into a") {
  warm_combine_specs();
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  for (int head_dim : {128, 40}) {  // vectors; element by element
    for (DType dtype : kDTypes) {
      const int rows = std::uniform_int_distribution<int>(4, 40)(rng);
      const int heads = std::uniform_int_distribution<int>(1, 6)(rng);
      const States s = random_states(2, rows, heads, head_dim, dtype, rng);
      // The empty states (-inf in the reference, NaN values) are given to the kernel as +inf, half of them.
      std::vector<float> given = s.lse;
      size_t plus_inf = 0;
      for (size_t i = 0; i < given.size(); ++i) {
        if (std::isinf(given[i]) && (i % 2 == 0)) given[i] = -given[i], ++plus_inf;
      }
      REQUIRE(plus_inf > 0);
      const Expected e = reference(s);
      TwoStates in(s, dtype, given);
      // Out is a itself and out_lse lse_a: every state of a row is read before its output is written.
      DeviceArray& a = in.a;
      const TensorView out_lse_view = in.lse_a.view();
      const std::string what = fmt::format("merge_state in place {} rows={} heads={} head_dim={} +inf={} seed={}",
                                           name_of(dtype), rows, heads, head_dim, plus_inf, seed);
      try {
        gpu_tests_runtime().merge_state(a.view(), in.lse_a.view(), in.b.view(), in.lse_b.view(), a.view(),
                                        &out_lse_view);
      } catch (const std::exception& error) {
        FAIL_CHECK(fmt::format("{}: {}", what, error.what()));
        continue;
      }
      const MergeVerdict v = judge(s, e, dtype, a.read(), in.lse_a.read(), 1e-5);
      CHECK_MESSAGE(v.ok(), fmt::format("{}: {}", what, v.summary()));
    }
  }
}

TEST_CASE("plan_combine: split-KV partials on two row levels, launched through the registry") {
  namespace d = jitattn::detail;
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  for (int splits : {1, 7, 64}) {
    const int batch = 3, seqlen = 2, heads = 5, head_dim = 128, rows = batch * seqlen;
    const States s = random_states(splits, rows, heads, head_dim, DType::f32, rng);
    const Expected e = reference(s);
    // Partials [splits, batch, seqlen + 1, heads, D]: a spare (NaN) row per batch, so the batch stride is not
    // seqlen row strides and a wrong batch index reads NaN.
    const int64_t row_stride = int64_t(heads) * head_dim, batch_stride = (seqlen + 1) * row_stride;
    const int64_t split_stride = batch * batch_stride;
    DeviceBuffer partials(static_cast<size_t>(splits) * split_stride * 4);
    std::vector<float> image(static_cast<size_t>(splits) * split_stride, std::nanf(""));
    const size_t pairs = static_cast<size_t>(rows) * heads;
    for (int sp = 0; sp < splits; ++sp)
      for (int b = 0; b < batch; ++b)
        for (int r = 0; r < seqlen; ++r)
          for (int h = 0; h < heads; ++h)
            std::copy_n(&s.values[((sp * pairs) + (b * seqlen + r) * heads + h) * head_dim], head_dim,
                        &image[sp * split_stride + b * batch_stride + r * row_stride + h * head_dim]);
    partials.upload(image.data(), image.size() * 4);
    DeviceArray lse(DType::f32, {splits, batch, seqlen, heads}, layout_strides({splits, batch, seqlen, heads}, {0, 1, 2, 3}, 0));
    lse.upload(s.lse);
    // out [batch, seqlen, heads, D] bf16 with padded rows; out_lse as forward's lse, [batch, heads, seqlen].
    const std::vector<int64_t> out_shape = {batch, seqlen, heads, head_dim};
    DeviceArray out(DType::bf16, out_shape, layout_strides(out_shape, {0, 1, 2, 3}, 8));
    DeviceArray out_lse(DType::f32, {batch, seqlen, heads}, layout_strides({batch, seqlen, heads}, {0, 2, 1}, 0));

    d::CombineProblem q;
    q.state_dtype = DType::f32;
    q.out_dtype = DType::bf16;
    q.states = partials.get();
    q.lse = static_cast<const float*>(lse.data());
    q.out = out.data();
    q.out_lse = static_cast<float*>(out_lse.data());
    q.num_states = splits, q.batch = batch, q.seqlen = seqlen, q.heads = heads, q.head_dim = head_dim;
    const int64_t states_strides[4] = {split_stride, batch_stride, row_stride, head_dim};
    std::copy(states_strides, states_strides + 4, q.states_strides);
    const TensorView lv = lse.view(), ov = out.view(), olv = out_lse.view();
    std::copy(lv.strides, lv.strides + 4, q.lse_strides);
    std::copy(ov.strides, ov.strides + 3, q.out_strides);
    std::copy(olv.strides, olv.strides + 3, q.out_lse_strides);
    d::CombinePlan plan = d::plan_combine(q);

    d::KernelBuilder builder(d::TemplateSet(), std::make_unique<d::NoCache>());
    d::KernelRegistry registry(builder);
    const d::ContextRef context = registry.current_context();
    const d::DeviceInfo& device = registry.device_info(context);
    const d::LoadedKernel& kernel = registry.get(plan.spec, context, device, nullptr);
    CHECK(kernel.threads == static_cast<unsigned>(kCombineThreads));
    void* arguments[] = {&plan.params};
    d::check_cuda(d::driver().cuLaunchKernel(kernel.function, plan.grid, 1, 1, kernel.threads, 1, 1, kernel.smem_bytes,
                                             nullptr, arguments, nullptr),
                  "cuLaunchKernel");
    MergeVerdict v = judge(s, e, DType::bf16, out.read(), out_lse.read(), 1e-5);
    v.outside = out.written_outside() + out_lse.written_outside();
    CHECK_MESSAGE(v.ok(), fmt::format("split-KV splits={} batch={} seqlen={} heads={} seed={}: {}", splits, batch, seqlen,
                                      heads, seed, v.summary()));
  }
}

TEST_CASE("merge_states is graph-capturable once warm") {
  warm_combine_specs();
  const auto& drv = detail::driver();
  const uint64_t seed = clock_seed();
  std::mt19937_64 rng(seed);
  const States s = random_states(17, 9, 4, 128, DType::f32, rng);
  const Expected e = reference(s);
  DeviceArray states(DType::f32, {17, 9, 4, 128}, layout_strides({17, 9, 4, 128}, {0, 1, 2, 3}, 0));
  DeviceArray lse(DType::f32, {17, 9, 4}, layout_strides({17, 9, 4}, {0, 1, 2}, 0));
  DeviceArray out(DType::bf16, {9, 4, 128}, layout_strides({9, 4, 128}, {0, 1, 2}, 0));
  DeviceArray out_lse(DType::f32, {9, 4}, layout_strides({9, 4}, {0, 1}, 0));
  states.upload(s.values);
  lse.upload(s.lse);
  const TensorView out_lse_view = out_lse.view();
  CUstream stream = nullptr;
  REQUIRE(drv.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  gpu_tests_runtime().merge_states(states.view(), lse.view(), out.view(), &out_lse_view, stream);  // warm
  REQUIRE(drv.cuStreamSynchronize(stream) == CUDA_SUCCESS);
  out.poison();
  out_lse.poison();
  CUgraph graph = nullptr;
  REQUIRE(drv.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  gpu_tests_runtime().merge_states(states.view(), lse.view(), out.view(), &out_lse_view, stream);
  REQUIRE(drv.cuStreamEndCapture(stream, &graph) == CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  REQUIRE(drv.cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS);
  REQUIRE(drv.cuGraphLaunch(exec, stream) == CUDA_SUCCESS);
  REQUIRE(drv.cuStreamSynchronize(stream) == CUDA_SUCCESS);
  const MergeVerdict v = judge(s, e, DType::bf16, out.read(), out_lse.read(), 1e-5);
  CHECK_MESSAGE(v.ok(), fmt::format("graph replay, seed {}: {}", seed, v.summary()));
  drv.cuGraphExecDestroy(exec);
  drv.cuGraphDestroy(graph);
  drv.cuStreamDestroy(stream);
}

TEST_CASE("merge_states throughput (reported, not checked)") {
  warm_combine_specs();
  const auto& drv = detail::driver();
  struct Shape {
    int states, rows, heads, head_dim;
    DType state_dtype, out_dtype;
  };
  const Shape shapes[] = {{32, 256, 32, 128, DType::f32, DType::bf16},  // split-KV decode: 256 sequences × 32 heads
                          {128, 64, 32, 128, DType::f32, DType::bf16},
                          {8, 1024, 32, 128, DType::f32, DType::bf16},
                          {2, 16384, 32, 128, DType::bf16, DType::bf16},  // cascade: prefix + suffix
                          {4, 512, 8, 256, DType::f32, DType::f32},
                          // element by element (head dims that are not a multiple of 8)
                          {8, 1024, 32, 111, DType::f32, DType::bf16},
                          {2, 16384, 32, 111, DType::bf16, DType::bf16}};
  // Random values, and LSEs within ±1 of each other so that every state is read.
  std::mt19937_64 rng(clock_seed());
  auto random_values = [&](size_t count, float low, float high) {
    std::uniform_real_distribution<float> value(low, high);
    std::vector<float> values(count);
    for (float& v : values) v = value(rng);
    return values;
  };
  CUevent start = nullptr, stop = nullptr;
  REQUIRE(drv.cuEventCreate(&start, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  REQUIRE(drv.cuEventCreate(&stop, CU_EVENT_DEFAULT) == CUDA_SUCCESS);
  for (const Shape& shape : shapes) {
    const std::vector<int64_t> states_shape = {shape.states, shape.rows, shape.heads, shape.head_dim};
    const std::vector<int64_t> lse_shape = {shape.states, shape.rows, shape.heads};
    const std::vector<int64_t> out_shape = {shape.rows, shape.heads, shape.head_dim};
    DeviceArray states(shape.state_dtype, states_shape, layout_strides(states_shape, {0, 1, 2, 3}, 0));
    DeviceArray lse(DType::f32, lse_shape, layout_strides(lse_shape, {0, 1, 2}, 0));
    DeviceArray out(shape.out_dtype, out_shape, layout_strides(out_shape, {0, 1, 2}, 0));
    states.upload(random_values(states.count(), -2.f, 2.f));
    lse.upload(random_values(lse.count(), -1.f, 1.f));
    auto run = [&] { gpu_tests_runtime().merge_states(states.view(), lse.view(), out.view(), nullptr); };
    for (int i = 0; i < 3; ++i) run();
    const int reps = 20;
    drv.cuEventRecord(start, nullptr);
    for (int i = 0; i < reps; ++i) run();
    drv.cuEventRecord(stop, nullptr);
    drv.cuEventSynchronize(stop);
    float ms = 0;
    drv.cuEventElapsedTime(&ms, start, stop);
    const double bytes = double(states.count()) * element_bytes(shape.state_dtype) + double(lse.count()) * 4 +
                         double(out.count()) * element_bytes(shape.out_dtype);
    const double seconds = ms / 1e3 / reps;
    MESSAGE(fmt::format("merge_states {} states × {} rows × {} heads × d{} {}→{}: {:.1f} µs, {:.0f} GB/s", shape.states,
                        shape.rows, shape.heads, shape.head_dim, name_of(shape.state_dtype), name_of(shape.out_dtype),
                        seconds * 1e6, bytes / seconds / 1e9));
  }
  drv.cuEventDestroy(start);
  drv.cuEventDestroy(stop);
}

}  // TEST_SUITE
