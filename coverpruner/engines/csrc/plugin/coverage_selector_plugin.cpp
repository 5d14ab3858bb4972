// TensorRT plugin "CoverageSelector" (IPluginV3, TensorRT >= 10) around cp_coverage_select.
//
// All rules (fields, shapes, types, workspace) live in selector_plugin_core.*; this file only
// converts TensorRT's types to the core's and calls the CUDA entry point. Built by CMake only
// when NvInfer.h is found. getCreators() at the end lets `trtexec --dynamicPlugins=lib.so`,
// IPluginRegistry::loadLibrary and ONNX Runtime's trt_extra_plugin_lib_paths load it.
#include "selector_plugin_core.h"

#include "coverpruner/coverage_select.h"

#include <NvInferRuntime.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace coverpruner
{
namespace plugin
{
namespace
{

using namespace nvinfer1;

void log_error(std::string const& message)
{
    // Creators have no logger in the V3 API; stderr is where trtexec and ORT users look.
    std::fprintf(stderr, "[CoverageSelector] %s\n", message.c_str());
}

DType to_core(DataType t)
{
    switch (t)
    {
    case DataType::kFLOAT: return DType::kFloat32;
    case DataType::kHALF: return DType::kFloat16;
    case DataType::kINT32: return DType::kInt32;
    case DataType::kINT64: return DType::kInt64;
    default: return DType::kOther;
    }
}

FieldKind to_core(PluginFieldType t)
{
    switch (t)
    {
    case PluginFieldType::kINT32: return FieldKind::kInt32;
    case PluginFieldType::kINT64: return FieldKind::kInt64;
    case PluginFieldType::kFLOAT32: return FieldKind::kFloat32;
    case PluginFieldType::kFLOAT64: return FieldKind::kFloat64;
    case PluginFieldType::kCHAR: return FieldKind::kChar;
    default: return FieldKind::kOther;
    }
}

Shape to_core(Dims const& dims)
{
    Shape s;
    s.rank = dims.nbDims < 0 ? 0 : (dims.nbDims > kMaxRank ? kMaxRank : dims.nbDims);
    for (int32_t i = 0; i < s.rank; ++i)
        s.dims[i] = dims.d[i];
    return s;
}

class CoverageSelectorPlugin final : public IPluginV3,
                                     public IPluginV3OneCore,
                                     public IPluginV3OneBuild,
                                     public IPluginV3OneRuntime
{
public:
    explicit CoverageSelectorPlugin(SelectorConfig config)
        : mConfig(config)
    {
        mSerialField = PluginField("budget", &mConfig.budget, PluginFieldType::kINT64, 1);
        mSerialFields.nbFields = 1;
        mSerialFields.fields = &mSerialField;
    }

    // IPluginV3
    IPluginCapability* getCapabilityInterface(PluginCapabilityType type) noexcept override
    {
        switch (type)
        {
        case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
        case PluginCapabilityType::kBUILD: return static_cast<IPluginV3OneBuild*>(this);
        case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
        default: return nullptr;
        }
    }

    IPluginV3* clone() noexcept override
    {
        return new (std::nothrow) CoverageSelectorPlugin(mConfig);
    }

    // IPluginV3OneCore
    AsciiChar const* getPluginName() const noexcept override { return kPluginName; }
    AsciiChar const* getPluginVersion() const noexcept override { return kPluginVersion; }
    AsciiChar const* getPluginNamespace() const noexcept override { return kPluginNamespace; }

    // IPluginV3OneBuild
    int32_t configurePlugin(DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override
    {
        if (nbInputs != kNbInputs || nbOutputs != kNbOutputs)
            return -1;
        std::string const error = check_input_shapes(to_core(in[0].desc.dims), to_core(in[1].desc.dims),
            to_core(in[2].desc.dims));
        if (!error.empty())
        {
            log_error(error);
            return -1;
        }
        (void) out;
        return 0;
    }

    int32_t getOutputDataTypes(DataType* outputTypes, int32_t nbOutputs, DataType const* inputTypes,
        int32_t nbInputs) const noexcept override
    {
        if (nbOutputs != kNbOutputs || nbInputs != kNbInputs)
            return -1;
        (void) inputTypes;
        outputTypes[0] = DataType::kINT64;
        return 0;
    }

    int32_t getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& exprBuilder) noexcept override
    {
        (void) shapeInputs;
        (void) nbShapeInputs;
        if (nbInputs != kNbInputs || nbOutputs != kNbOutputs)
            return -1;
        DimsExprs const& features = inputs[0];
        if (features.nbDims != 2 && features.nbDims != 3)
        {
            log_error("image_features must be [n, d] or [B, n, d], got rank " + std::to_string(features.nbDims));
            return -1;
        }
        // m = min(n, budget): the same rule as keep_length(), in TensorRT's shape algebra.
        int32_t const n_axis = features.nbDims - 2;
        IDimensionExpr const* m = exprBuilder.operation(
            DimensionOperation::kMIN, *features.d[n_axis], *exprBuilder.constant(mConfig.budget));
        outputs[0].nbDims = features.nbDims - 1;
        if (features.nbDims == 3)
            outputs[0].d[0] = features.d[0];
        outputs[0].d[outputs[0].nbDims - 1] = m;
        return 0;
    }

    bool supportsFormatCombination(
        int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept override
    {
        if (nbInputs != kNbInputs || nbOutputs != kNbOutputs || pos < 0 || pos >= kNbInputs + kNbOutputs)
            return false;
        PluginTensorDesc const& desc = inOut[pos].desc;
        DType const features_type = to_core(inOut[0].desc.type);
        return supports_type(pos, to_core(desc.type), desc.format == TensorFormat::kLINEAR, features_type);
    }

    int32_t getNbOutputs() const noexcept override { return kNbOutputs; }

    size_t getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override
    {
        (void) outputs;
        (void) nbOutputs;
        if (nbInputs != kNbInputs)
            return 0;
        // The profile's largest features shape bounds every shape this engine will run.
        return workspace_bytes(to_core(inputs[0].max), to_core(inputs[0].desc.type));
    }

    // IPluginV3OneRuntime
    int32_t onShapeChange(PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override
    {
        if (nbInputs != kNbInputs || nbOutputs != kNbOutputs)
            return -1;
        std::string const error = check_input_shapes(to_core(in[0].dims), to_core(in[1].dims), to_core(in[2].dims));
        if (!error.empty())
        {
            log_error(error);
            return -1;
        }
        (void) out;
        return 0;
    }

    int32_t enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* outputDesc, void const* const* inputs,
        void* const* outputs, void* workspace, cudaStream_t stream) noexcept override
    {
        (void) outputDesc;
        Shape const features = to_core(inputDesc[0].dims);
        int64_t batch = 0, n = 0, d = 0;
        if (!problem_dims(features, &batch, &n, &d))
            return -1;
        DType const type = to_core(inputDesc[0].type);
        int const dtype = type == DType::kFloat16 ? CP_DTYPE_FLOAT16 : CP_DTYPE_FLOAT32;
        size_t const bytes = workspace_bytes(features, type);
        // tau is read on the device (input 2), so no host sync; the host value is unused.
        int const status = cp_coverage_select(inputs[0], dtype, static_cast<float const*>(inputs[1]), batch, n, d,
            mConfig.budget, 0.f, static_cast<float const*>(inputs[2]), static_cast<int64_t*>(outputs[0]), workspace,
            bytes, stream, nullptr);
        if (status != CP_OK)
        {
            log_error(std::string(cp_status_string(status)) + ": " + cp_last_error());
            return -1;
        }
        return 0;
    }

    IPluginV3* attachToContext(IPluginResourceContext* context) noexcept override
    {
        (void) context;
        return clone();
    }

    PluginFieldCollection const* getFieldsToSerialize() noexcept override { return &mSerialFields; }

private:
    SelectorConfig mConfig;
    PluginField mSerialField;
    PluginFieldCollection mSerialFields{};
};

class CoverageSelectorCreator final : public IPluginCreatorV3One
{
public:
    CoverageSelectorCreator()
    {
        mFieldNames.emplace_back("budget", nullptr, PluginFieldType::kINT64, 1);
        mFields.nbFields = static_cast<int32_t>(mFieldNames.size());
        mFields.fields = mFieldNames.data();
    }

    IPluginV3* createPlugin(AsciiChar const* name, PluginFieldCollection const* fc, TensorRTPhase phase) noexcept override
    {
        (void) name;
        (void) phase;
        std::vector<FieldView> views;
        if (fc != nullptr)
            for (int32_t i = 0; i < fc->nbFields; ++i)
            {
                PluginField const& f = fc->fields[i];
                views.push_back(FieldView{f.name, f.data, to_core(f.type), f.length});
            }
        ParseResult const parsed = parse_fields(views.data(), static_cast<int32_t>(views.size()));
        if (!parsed.ok)
        {
            log_error(parsed.error);
            return nullptr;
        }
        return new (std::nothrow) CoverageSelectorPlugin(parsed.config);
    }

    PluginFieldCollection const* getFieldNames() noexcept override { return &mFields; }
    AsciiChar const* getPluginName() const noexcept override { return kPluginName; }
    AsciiChar const* getPluginVersion() const noexcept override { return kPluginVersion; }
    AsciiChar const* getPluginNamespace() const noexcept override { return kPluginNamespace; }

private:
    std::vector<PluginField> mFieldNames;
    PluginFieldCollection mFields{};
};

} // namespace
} // namespace plugin
} // namespace coverpruner

// TENSORRTAPI is empty outside TensorRT's own build, so the export is spelled out: the library
// is built with hidden visibility and this must be the one symbol TensorRT can find.
extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginCreatorInterface* const* getCreators(
    int32_t& nbCreators)
{
    static coverpruner::plugin::CoverageSelectorCreator creator;
    static nvinfer1::IPluginCreatorInterface* const creators[] = {&creator};
    nbCreators = 1;
    return creators;
}
