// Header-free core of the "CoverageSelector" TensorRT plugin: identity, attribute parsing, shape
// and type rules, workspace size. No TensorRT or CUDA headers, so g++ unit tests run anywhere;
// coverage_selector_plugin.cpp only translates TensorRT's types into these and back.
//
// Node contract (selector graph, plugin form; tensor names are those of docs/engine-dir.md):
//   inputs   image_features  float32|float16 [n, d] or [B, n, d]
//            relevance       float32         [n]    or [B, n]
//            budget          int64 scalar    [] or [1]     read on the device
//            tau             float32 scalar  [] or [1]     read on the device
//   outputs  keep            int64           [m]    or [B, m], m = min(budget, n), sorted ascending
//            keep_length     int32 scalar    []            m; TensorRT's size tensor for keep's last axis
//   field    opt_budget      optional int32|int64 >= 1 (default 64): the m TensorRT plans memory and
//                            tactics for (declareSizeTensor's opt value); the upper bound is n
// The budget is a runtime tensor, so one engine serves every budget; keep's length is data-dependent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace coverpruner
{
namespace plugin
{

// Identity. ONNX nodes use domain kOnnxDomain (the domain ONNX Runtime's TensorRT provider
// registers for plugins loaded through trt_extra_plugin_lib_paths) and op type kPluginName.
constexpr char kPluginName[] = "CoverageSelector";
constexpr char kPluginVersion[] = "1";
constexpr char kPluginNamespace[] = "";
constexpr char kOnnxDomain[] = "trt.plugins";
constexpr int kNbInputs = 4;
constexpr int kNbOutputs = 2;
constexpr int64_t kDefaultOptBudget = 64;
// I/O positions as TensorRT numbers them (inputs first, then outputs).
constexpr int kPosFeatures = 0;
constexpr int kPosRelevance = 1;
constexpr int kPosBudget = 2;
constexpr int kPosTau = 3;
constexpr int kPosKeep = 4;
constexpr int kPosKeepLength = 5;
constexpr int kMaxRank = 8;

enum class FieldKind
{
    kInt32,
    kInt64,
    kFloat32,
    kFloat64,
    kChar,
    kOther
};

// One plugin field as TensorRT hands it over (PluginField without the TensorRT type).
struct FieldView
{
    char const* name;
    void const* data;
    FieldKind kind;
    int32_t length;
};

struct SelectorConfig
{
    int64_t opt_budget = kDefaultOptBudget;
};

struct ParseResult
{
    bool ok = false;
    std::string error; // names the field, what was expected and what came
    SelectorConfig config;
};

// Reads the plugin fields: optional "opt_budget" (int32 or int64, length 1, >= 1); unknown fields
// are errors so a misspelt attribute never falls back to a default silently.
ParseResult parse_fields(FieldView const* fields, int32_t nb_fields);

enum class DType
{
    kFloat32,
    kFloat16,
    kInt32,
    kInt64,
    kOther
};

// A shape with -1 for dimensions unknown at build time.
struct Shape
{
    int32_t rank = 0;
    int64_t dims[kMaxRank] = {};
};

// "" when the four input shapes fit the node contract, else a message naming the input.
// Unknown (-1) dimensions are accepted; equal-length checks run only where both are known.
std::string check_input_shapes(Shape const& features, Shape const& relevance, Shape const& budget, Shape const& tau);

// m = min(budget, n), 0 for a negative budget (what the kernel does); -1 when n is unknown.
int64_t keep_length(int64_t n, int64_t budget);

// The size-tensor bounds of m for a features axis of n tokens: opt = min(opt_budget, n), upper = n.
// -1 for both when n is unknown (TensorRT then works with its symbolic expressions).
void keep_length_bounds(int64_t n, int64_t opt_budget, int64_t* opt, int64_t* upper);

// keep's largest shape from the features' shape: [n, d] -> [n], [B, n, d] -> [B, n].
Shape keep_upper_shape(Shape const& features);

// Axis of features that holds n (0 for [n, d], 1 for [B, n, d]); -1 for other ranks.
int32_t token_axis(int32_t features_rank);

// supportsFormatCombination's type rule for I/O position pos (kPos*); `linear` is whether the
// format is the plain row-major one. features_type is the type chosen at kPosFeatures.
bool supports_type(int32_t pos, DType type, bool linear, DType features_type);

// Output types: keep int64; keep_length int32, the size-tensor type that getOutputDataTypes' documentation in
// NvInferRuntime.h requires ("must be DataType::kINT32") in every TensorRT from 10.0 to 11.1.
DType output_type(int32_t output_index);

// Bytes of workspace for the largest shape the engine allows (the C API's layout); 0 if the
// shape is not a valid features shape or the dtype is not float32/float16.
size_t workspace_bytes(Shape const& features, DType features_type);

// (batch, n, d) of a features shape: rank 2 -> batch 1. false when the rank is not 2 or 3.
bool problem_dims(Shape const& features, int64_t* batch, int64_t* n, int64_t* d);

} // namespace plugin
} // namespace coverpruner
