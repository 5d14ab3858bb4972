// Header-free core of the "CoverageSelector" TensorRT plugin: identity, attribute parsing, shape
// and type rules, workspace size. No TensorRT or CUDA headers, so g++ unit tests run anywhere;
// coverage_selector_plugin.cpp only translates TensorRT's types into these and back.
//
// Node contract (selector graph, plugin form):
//   inputs   image_features  float32|float16 [n, d] or [B, n, d]
//            relevance       float32         [n]    or [B, n]
//            tau             float32 scalar  [] or [1]
//   output   keep            int64           [m]    or [B, m], m = min(budget, n), sorted ascending
//   field    budget          int32 or int64 scalar, >= 0 (an attribute: it fixes the output shape)
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
constexpr int kNbInputs = 3;
constexpr int kNbOutputs = 1;
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
    int64_t budget = -1;
};

struct ParseResult
{
    bool ok = false;
    std::string error; // names the field, what was expected and what came
    SelectorConfig config;
};

// Reads the plugin fields: exactly one "budget" (int32 or int64, length 1, >= 0); unknown fields
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

// "" when the three input shapes fit the node contract, else a message naming the input.
// Unknown (-1) dimensions are accepted; equal-length checks run only where both are known.
std::string check_input_shapes(Shape const& features, Shape const& relevance, Shape const& tau);

// m = min(budget, n); -1 when n is unknown.
int64_t keep_length(int64_t n, int64_t budget);

// keep's shape from the features' shape: [n, d] -> [m], [B, n, d] -> [B, m].
Shape output_shape(Shape const& features, int64_t budget);

// supportsFormatCombination's type rule for I/O position pos (0..2 inputs, 3 output); `linear`
// is whether the format is the plain row-major one. features_type is the type chosen at pos 0.
bool supports_type(int32_t pos, DType type, bool linear, DType features_type);

// Output type for a features input type.
DType output_type();

// Bytes of workspace for the largest shape the engine allows (the C API's layout); 0 if the
// shape is not a valid features shape or the dtype is not float32/float16.
size_t workspace_bytes(Shape const& features, DType features_type);

// (batch, n, d) of a features shape: rank 2 -> batch 1. false when the rank is not 2 or 3.
bool problem_dims(Shape const& features, int64_t* batch, int64_t* n, int64_t* d);

} // namespace plugin
} // namespace coverpruner
