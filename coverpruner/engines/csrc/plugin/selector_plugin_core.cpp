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

} // namespace

ParseResult parse_fields(FieldView const* fields, int32_t nb_fields)
{
    ParseResult result;
    bool have_budget = false;
    for (int32_t f = 0; f < nb_fields; ++f)
    {
        FieldView const& field = fields[f];
        std::string const name = field.name != nullptr ? field.name : "";
        if (name != "budget")
        {
            result.error = std::string(kPluginName) + ": unknown field '" + name + "' (expected only 'budget')";
            return result;
        }
        if (field.kind != FieldKind::kInt32 && field.kind != FieldKind::kInt64)
        {
            result.error = std::string(kPluginName) + ": field 'budget' must be int32 or int64, got "
                + kind_name(field.kind);
            return result;
        }
        if (field.length != 1 || field.data == nullptr)
        {
            result.error = std::string(kPluginName) + ": field 'budget' must hold exactly 1 value, got "
                + std::to_string(field.length);
            return result;
        }
        int64_t budget = 0;
        if (field.kind == FieldKind::kInt32)
        {
            int32_t v = 0;
            std::memcpy(&v, field.data, sizeof(v));
            budget = v;
        }
        else
            std::memcpy(&budget, field.data, sizeof(budget));
        if (budget < 0)
        {
            result.error = std::string(kPluginName) + ": field 'budget' must be >= 0, got " + std::to_string(budget);
            return result;
        }
        result.config.budget = budget;
        have_budget = true;
    }
    if (!have_budget)
    {
        result.error = std::string(kPluginName) + ": required field 'budget' is missing";
        return result;
    }
    result.ok = true;
    return result;
}

std::string check_input_shapes(Shape const& features, Shape const& relevance, Shape const& tau)
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
    const bool scalar = tau.rank == 0 || (tau.rank == 1 && (tau.dims[0] == 1 || tau.dims[0] < 0));
    if (!scalar)
        return "tau must be a scalar ([] or [1]), got " + shape_str(tau);
    return "";
}

int64_t keep_length(int64_t n, int64_t budget)
{
    if (n < 0)
        return -1;
    return budget < n ? budget : n;
}

Shape output_shape(Shape const& features, int64_t budget)
{
    Shape out;
    if (features.rank == 2)
    {
        out.rank = 1;
        out.dims[0] = keep_length(features.dims[0], budget);
    }
    else if (features.rank == 3)
    {
        out.rank = 2;
        out.dims[0] = features.dims[0];
        out.dims[1] = keep_length(features.dims[1], budget);
    }
    return out;
}

bool supports_type(int32_t pos, DType type, bool linear, DType features_type)
{
    if (!linear)
        return false;
    switch (pos)
    {
    case 0: return type == DType::kFloat32 || type == DType::kFloat16;
    case 1: return type == DType::kFloat32;
    case 2: return type == DType::kFloat32;
    case 3: return type == DType::kInt64 && (features_type == DType::kFloat32 || features_type == DType::kFloat16);
    default: return false;
    }
}

DType output_type()
{
    return DType::kInt64;
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
