// Header-free rules of the CoverageSelector plugin (see selector_plugin_core.h).
#include "selector_plugin_core.h"

#include "coverpruner/coverage_workspace.h"

#include <cstring>

namespace coverpruner
{
namespace plugin
{

namespace
{

char const* kind_name(FieldKind kind)
{
    switch (kind)
    {
    case FieldKind::kInt32: return "int32";
    case FieldKind::kInt64: return "int64";
    case FieldKind::kFloat32: return "float32";
    case FieldKind::kFloat64: return "float64";
    case FieldKind::kChar: return "char";
    default: return "another type";
    }
}

std::string shape_str(Shape const& s)
{
    std::string out = "[";
    for (int32_t i = 0; i < s.rank; ++i)
    {
        if (i)
            out += ", ";
        out += s.dims[i] < 0 ? std::string("?") : std::to_string(s.dims[i]);
    }
    return out + "]";
}

bool known_and_differ(int64_t a, int64_t b)
{
    return a >= 0 && b >= 0 && a != b;
}

bool is_scalar(Shape const& s)
{
    return s.rank == 0 || (s.rank == 1 && (s.dims[0] == 1 || s.dims[0] < 0));
}

} // namespace

ParseResult parse_fields(FieldView const* fields, int32_t nb_fields)
{
    ParseResult result;
    for (int32_t f = 0; f < nb_fields; ++f)
    {
        FieldView const& field = fields[f];
        std::string const name = field.name != nullptr ? field.name : "";
        if (name != "opt_budget")
        {
            result.error = std::string(kPluginName) + ": unknown field '" + name + "' (expected only 'opt_budget')";
            return result;
        }
        if (field.kind != FieldKind::kInt32 && field.kind != FieldKind::kInt64)
        {
            result.error = std::string(kPluginName) + ": field 'opt_budget' must be int32 or int64, got "
                + kind_name(field.kind);
            return result;
        }
        if (field.length != 1 || field.data == nullptr)
        {
            result.error = std::string(kPluginName) + ": field 'opt_budget' must hold exactly 1 value, got "
                + std::to_string(field.length);
            return result;
        }
        int64_t value = 0;
        if (field.kind == FieldKind::kInt32)
        {
            int32_t v = 0;
            std::memcpy(&v, field.data, sizeof(v));
            value = v;
        }
        else
            std::memcpy(&value, field.data, sizeof(value));
        if (value < 1)
        {
            result.error = std::string(kPluginName) + ": field 'opt_budget' must be >= 1, got " + std::to_string(value);
            return result;
        }
        result.config.opt_budget = value;
    }
    result.ok = true;
    return result;
}

std::string check_input_shapes(Shape const& features, Shape const& relevance, Shape const& budget, Shape const& tau)
{
    if (features.rank != 2 && features.rank != 3)
        return "image_features must be [n, d] or [B, n, d], got rank " + std::to_string(features.rank) + " "
            + shape_str(features);
    if (relevance.rank != features.rank - 1)
        return "relevance must have rank " + std::to_string(features.rank - 1) + " to match image_features "
            + shape_str(features) + ", got " + shape_str(relevance);
    for (int32_t i = 0; i < relevance.rank; ++i)
        if (known_and_differ(relevance.dims[i], features.dims[i]))
            return "relevance " + shape_str(relevance) + " does not match image_features " + shape_str(features)
                + " on axis " + std::to_string(i);
    if (!is_scalar(budget))
        return "budget must be a scalar ([] or [1]), got " + shape_str(budget);
    if (!is_scalar(tau))
        return "tau must be a scalar ([] or [1]), got " + shape_str(tau);
    return "";
}

int64_t keep_length(int64_t n, int64_t budget)
{
    if (n < 0)
        return -1;
    if (budget < 0)
        return 0;
    return budget < n ? budget : n;
}

void keep_length_bounds(int64_t n, int64_t opt_budget, int64_t* opt, int64_t* upper)
{
    *opt = n < 0 ? -1 : (opt_budget < n ? opt_budget : n);
    *upper = n;
}

int32_t token_axis(int32_t features_rank)
{
    return features_rank == 2 ? 0 : (features_rank == 3 ? 1 : -1);
}

Shape keep_upper_shape(Shape const& features)
{
    Shape out;
    const int32_t axis = token_axis(features.rank);
    if (axis < 0)
        return out;
    out.rank = features.rank - 1;
    for (int32_t i = 0; i < out.rank; ++i)
        out.dims[i] = features.dims[i];
    return out;
}

bool supports_type(int32_t pos, DType type, bool linear, DType features_type)
{
    if (!linear)
        return false;
    switch (pos)
    {
    case kPosFeatures: return type == DType::kFloat32 || type == DType::kFloat16;
    case kPosRelevance: return type == DType::kFloat32;
    case kPosBudget: return type == DType::kInt64;
    case kPosTau: return type == DType::kFloat32;
    case kPosKeep:
        return type == DType::kInt64 && (features_type == DType::kFloat32 || features_type == DType::kFloat16);
    case kPosKeepLength:
        return type == DType::kInt32 && (features_type == DType::kFloat32 || features_type == DType::kFloat16);
    default: return false;
    }
}

DType output_type(int32_t output_index)
{
    return output_index == 0 ? DType::kInt64 : output_index == 1 ? DType::kInt32 : DType::kOther;
}

bool problem_dims(Shape const& features, int64_t* batch, int64_t* n, int64_t* d)
{
    if (features.rank == 2)
    {
        *batch = 1;
        *n = features.dims[0];
        *d = features.dims[1];
        return true;
    }
    if (features.rank == 3)
    {
        *batch = features.dims[0];
        *n = features.dims[1];
        *d = features.dims[2];
        return true;
    }
    return false;
}

size_t workspace_bytes(Shape const& features, DType features_type)
{
    int64_t batch = 0, n = 0, d = 0;
    if (!problem_dims(features, &batch, &n, &d))
        return 0;
    int dtype = 0;
    if (features_type == DType::kFloat32)
        dtype = CP_DTYPE_FLOAT32;
    else if (features_type == DType::kFloat16)
        dtype = CP_DTYPE_FLOAT16;
    else
        return 0;
    cp_workspace_layout layout;
    if (cp_workspace_layout_for(batch, n, d, dtype, &layout) != 0)
        return 0;
    return layout.total;
}

} // namespace plugin
} // namespace coverpruner
