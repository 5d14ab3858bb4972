// Unit tests of the header-free plugin core and the workspace layout (g++ only; CTest and
// tests/engines/test_csrc_core.py run it). Prints "N passed, M failed"; exit code 1 on failure.
#include "../plugin/selector_plugin_core.h"
#include "coverpruner/coverage_workspace.h"

#include <cstdio>
#include <string>

using namespace coverpruner::plugin;

namespace
{
int g_passed = 0;
int g_failed = 0;

void check(bool ok, char const* what, int line)
{
    if (ok)
        ++g_passed;
    else
    {
        ++g_failed;
        std::printf("FAILED line %d: %s\n", line, what);
    }
}
#define CHECK(expr) check((expr), #expr, __LINE__)

bool contains(std::string const& s, char const* part)
{
    return s.find(part) != std::string::npos;
}

Shape shape(std::initializer_list<int64_t> dims)
{
    Shape s;
    for (int64_t v : dims)
        s.dims[s.rank++] = v;
    return s;
}

size_t up(size_t x)
{
    return (x + 255) / 256 * 256;
}

void test_parse_fields()
{
    ParseResult r = parse_fields(nullptr, 0);
    CHECK(r.ok && r.config.opt_budget == kDefaultOptBudget && r.error.empty());

    int32_t b32 = 32;
    FieldView ok32{"opt_budget", &b32, FieldKind::kInt32, 1};
    r = parse_fields(&ok32, 1);
    CHECK(r.ok && r.config.opt_budget == 32);

    int64_t b64 = 128;
    FieldView ok64{"opt_budget", &b64, FieldKind::kInt64, 1};
    r = parse_fields(&ok64, 1);
    CHECK(r.ok && r.config.opt_budget == 128);

    FieldView unknown{"budget", &b64, FieldKind::kInt64, 1};
    r = parse_fields(&unknown, 1);
    CHECK(!r.ok && contains(r.error, "unknown field 'budget'") && contains(r.error, "CoverageSelector"));

    float f = 64.f;
    FieldView wrong_type{"opt_budget", &f, FieldKind::kFloat32, 1};
    r = parse_fields(&wrong_type, 1);
    CHECK(!r.ok && contains(r.error, "int32 or int64, got float32"));

    int64_t two[2] = {1, 2};
    FieldView wrong_len{"opt_budget", two, FieldKind::kInt64, 2};
    r = parse_fields(&wrong_len, 1);
    CHECK(!r.ok && contains(r.error, "exactly 1 value, got 2"));

    FieldView no_data{"opt_budget", nullptr, FieldKind::kInt64, 1};
    r = parse_fields(&no_data, 1);
    CHECK(!r.ok);

    int64_t zero = 0;
    FieldView zero_budget{"opt_budget", &zero, FieldKind::kInt64, 1};
    r = parse_fields(&zero_budget, 1);
    CHECK(!r.ok && contains(r.error, ">= 1, got 0"));
}

void test_shapes()
{
    Shape const scalar = shape({});
    CHECK(check_input_shapes(shape({576, 4096}), shape({576}), scalar, scalar).empty());
    CHECK(check_input_shapes(shape({2, 576, 4096}), shape({2, 576}), shape({1}), shape({1})).empty());
    CHECK(check_input_shapes(shape({-1, 4096}), shape({-1}), scalar, scalar).empty());
    CHECK(contains(check_input_shapes(shape({4096}), scalar, scalar, scalar), "got rank 1 [4096]"));
    CHECK(contains(check_input_shapes(shape({576, 4096}), shape({2, 576}), scalar, scalar), "relevance must have rank 1"));
    CHECK(contains(check_input_shapes(shape({576, 4096}), shape({575}), scalar, scalar), "does not match image_features"));
    CHECK(contains(check_input_shapes(shape({2, 576, 8}), shape({3, 576}), scalar, scalar), "on axis 0"));
    CHECK(contains(check_input_shapes(shape({576, 8}), shape({576}), shape({2}), scalar), "budget must be a scalar"));
    CHECK(contains(check_input_shapes(shape({576, 8}), shape({576}), scalar, shape({2})), "tau must be a scalar"));

    CHECK(keep_length(576, 64) == 64);
    CHECK(keep_length(10, 64) == 10);
    CHECK(keep_length(64, 64) == 64);
    CHECK(keep_length(-1, 64) == -1);
    CHECK(keep_length(576, 0) == 0);
    CHECK(keep_length(576, -5) == 0);

    int64_t opt = 0, upper = 0;
    keep_length_bounds(576, 64, &opt, &upper);
    CHECK(opt == 64 && upper == 576);
    keep_length_bounds(20, 64, &opt, &upper);
    CHECK(opt == 20 && upper == 20);
    keep_length_bounds(-1, 64, &opt, &upper);
    CHECK(opt == -1 && upper == -1);

    Shape o = keep_upper_shape(shape({576, 4096}));
    CHECK(o.rank == 1 && o.dims[0] == 576);
    o = keep_upper_shape(shape({3, 20, 8}));
    CHECK(o.rank == 2 && o.dims[0] == 3 && o.dims[1] == 20);
    o = keep_upper_shape(shape({-1, -1, 8}));
    CHECK(o.rank == 2 && o.dims[0] == -1 && o.dims[1] == -1);
    CHECK(keep_upper_shape(shape({4})).rank == 0);
    CHECK(token_axis(2) == 0 && token_axis(3) == 1 && token_axis(4) == -1);

    int64_t b = 0, n = 0, d = 0;
    CHECK(problem_dims(shape({576, 4096}), &b, &n, &d) && b == 1 && n == 576 && d == 4096);
    CHECK(problem_dims(shape({4, 576, 4096}), &b, &n, &d) && b == 4 && n == 576 && d == 4096);
    CHECK(!problem_dims(shape({4}), &b, &n, &d));
}

void test_types()
{
    CHECK(supports_type(kPosFeatures, DType::kFloat32, true, DType::kFloat32));
    CHECK(supports_type(kPosFeatures, DType::kFloat16, true, DType::kFloat16));
    CHECK(!supports_type(kPosFeatures, DType::kInt64, true, DType::kInt64));
    CHECK(!supports_type(kPosFeatures, DType::kFloat32, false, DType::kFloat32));
    CHECK(supports_type(kPosRelevance, DType::kFloat32, true, DType::kFloat16));
    CHECK(!supports_type(kPosRelevance, DType::kFloat16, true, DType::kFloat16));
    CHECK(supports_type(kPosBudget, DType::kInt64, true, DType::kFloat32));
    CHECK(!supports_type(kPosBudget, DType::kInt32, true, DType::kFloat32));
    CHECK(supports_type(kPosTau, DType::kFloat32, true, DType::kFloat32));
    CHECK(!supports_type(kPosTau, DType::kInt64, true, DType::kFloat32));
    CHECK(supports_type(kPosKeep, DType::kInt64, true, DType::kFloat16));
    CHECK(!supports_type(kPosKeep, DType::kInt32, true, DType::kFloat32));
    CHECK(supports_type(kPosKeepLength, DType::kInt32, true, DType::kFloat32)); // size tensor: int32
    CHECK(!supports_type(kPosKeepLength, DType::kInt64, true, DType::kFloat32));
    CHECK(!supports_type(kPosKeep, DType::kInt32, true, DType::kFloat32));
    CHECK(!supports_type(kPosKeepLength + 1, DType::kInt32, true, DType::kFloat32));
    CHECK(!supports_type(-1, DType::kFloat32, true, DType::kFloat32));
    CHECK(output_type(0) == DType::kInt64 && output_type(1) == DType::kInt32 && output_type(2) == DType::kOther);
    CHECK(kNbInputs == 4 && kNbOutputs == 2 && kPosKeep == kNbInputs);
}

void test_workspace()
{
    // LLaVA-1.5 7B: n=576, d=4096, fp16, batch 2; regions summed by hand.
    const size_t B = 2, N = 576, D = 4096;
    // normalized, similarity, weights + cover, gain + gain_error (float32), fresh (float64), changed_*, selected
    const size_t expected = up(B * N * D * 2) + up(B * N * N * 4) + up(B * N * 4) * 2 + up(B * N * 4) * 2
        + up(B * N * 8) + up(B * N * 4) * 3 + up(B * N);
    CHECK(workspace_bytes(shape({2, 576, 4096}), DType::kFloat16) == expected);
    CHECK(workspace_bytes(shape({576, 4096}), DType::kFloat32)
        == workspace_bytes(shape({1, 576, 4096}), DType::kFloat32));
    CHECK(workspace_bytes(shape({576, 4096}), DType::kFloat32) > workspace_bytes(shape({576, 4096}), DType::kFloat16));
    CHECK(workspace_bytes(shape({577, 4096}), DType::kFloat16) > workspace_bytes(shape({576, 4096}), DType::kFloat16));
    CHECK(workspace_bytes(shape({576, 4096}), DType::kInt64) == 0);
    CHECK(workspace_bytes(shape({4096}), DType::kFloat32) == 0);
    CHECK(workspace_bytes(shape({-1, 576, 4096}), DType::kFloat32) == 0);

    cp_workspace_layout layout;
    CHECK(cp_workspace_layout_for(3, 7, 5, CP_DTYPE_FLOAT16, &layout) == 0);
    size_t offsets[] = {layout.normalized, layout.similarity, layout.weights, layout.cover, layout.gain,
        layout.changed_row, layout.changed_old, layout.changed_new, layout.selected, layout.total};
    bool aligned = true, increasing = true;
    for (size_t i = 0; i < sizeof(offsets) / sizeof(offsets[0]); ++i)
    {
        aligned = aligned && offsets[i] % CP_WORKSPACE_ALIGN == 0;
        if (i)
            increasing = increasing && offsets[i] > offsets[i - 1];
    }
    CHECK(aligned);
    CHECK(increasing);
    // gain holds float64 [B, n]: the next region starts at least 8*B*n bytes later.
    CHECK(layout.changed_row - layout.gain >= 8 * 3 * 7);
    CHECK(cp_workspace_layout_for(1, 4, 4, 7, &layout) == -1);
    CHECK(cp_workspace_layout_for(-1, 4, 4, CP_DTYPE_FLOAT32, &layout) == -1);
    CHECK(cp_workspace_layout_for(1LL << 40, 1LL << 20, 4, CP_DTYPE_FLOAT32, &layout) == -1);
}
} // namespace

int main()
{
    test_parse_fields();
    test_shapes();
    test_types();
    test_workspace();
    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
}
