// TensorRT plugin "CoverageSelector" (IPluginV3, TensorRT >= 10) around cp_coverage_select.
//
// All rules (fields, shapes, types, workspace) live in selector_plugin_core.*; this file only
// converts TensorRT's types to the core's and calls the CUDA entry point. Built by CMake only
// when NvInfer.h is found. getCreators() at the end lets `trtexec --dynamicPlugins=lib.so`,
// IPluginRegistry::loadLibrary and ONNX Runtime's trt_extra_plugin_lib_paths load it.
#include "selector_plugin_core.h"

#include "coverpruner/coverage_select.h"

#include <NvInferRuntime.h>
#include <NvInferVersion.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace coverpruner
{
namespace plugin
{
namespace
{

using namespace nvinfer1;

// TensorRT >= 10.3 (and TensorRT-RTX) query the build capability as IPluginV3OneBuildV2; a plugin that
// only implements V1 is then read past the end of its vtable. Older 10.x releases have only V1.
#if NV_TENSORRT_MAJOR > 10 || (NV_TENSORRT_MAJOR == 10 && NV_TENSORRT_MINOR >= 3)
using BuildCapability = IPluginV3OneBuildV2;
#else
using BuildCapability = IPluginV3OneBuild;
#endif

// TensorRT hands plugin libraries a logger finder through setLoggerFinder (exported below);
// messages then appear in the application's TensorRT log. Without one they go to stderr.
std::mutex g_logger_mutex;
ILoggerFinder* g_logger_finder = nullptr;

void log_error(std::string const& message)
{
    std::string const text = std::string("[CoverageSelector] ") + message;
    ILogger* logger = nullptr;
    {
        std::lock_guard<std::mutex> lock(g_logger_mutex);
        if (g_logger_finder != nullptr)
            logger = g_logger_finder->findLogger();
    }
    if (logger != nullptr)
        logger->log(ILogger::Severity::kERROR, text.c_str());
    else
        std::fprintf(stderr, "%s\n", text.c_str());
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
                                     public BuildCapability,
                                     public IPluginV3OneRuntime
{
public:
    explicit CoverageSelectorPlugin(SelectorConfig config)
        : mConfig(config)
    {
        mSerialField = PluginField("opt_budget", &mConfig.opt_budget, PluginFieldType::kINT64, 1);
        mSerialFields.nbFields = 1;
        mSerialFields.fields = &mSerialField;
    }

    // IPluginV3
    IPluginCapability* getCapabilityInterface(PluginCapabilityType type) noexcept override
    {
        switch (type)
        {
        case PluginCapabilityType::kCORE: return static_cast<IPluginV3OneCore*>(this);
        case PluginCapabilityType::kBUILD: return static_cast<BuildCapability*>(this);
        case PluginCapabilityType::kRUNTIME: return static_cast<IPluginV3OneRuntime*>(this);
        default: return nullptr;
        }
    }

    ~CoverageSelectorPlugin() override { cp_cublas_destroy(mCublas); }

    CoverageSelectorPlugin(CoverageSelectorPlugin const&) = delete;
    CoverageSelectorPlugin& operator=(CoverageSelectorPlugin const&) = delete;

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
        std::string const error = check_input_shapes(to_core(in[kPosFeatures].desc.dims),
            to_core(in[kPosRelevance].desc.dims), to_core(in[kPosBudget].desc.dims), to_core(in[kPosTau].desc.dims));
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
        outputTypes[0] = DataType::kINT64; // keep
        // keep_length: NvInferRuntime.h (10.0 through 11.1) documents that "the data type for any size tensor
        // outputs must be DataType::kINT32"; int64 size tensors are only accepted by newer releases.
        outputTypes[1] = DataType::kINT32;
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
        // m = min(budget, n) is known only when the budget tensor is read on the device: keep's last
        // axis is the size tensor output 1, bounded by n, planned for min(opt_budget, n)
        // (keep_length_bounds in TensorRT's shape algebra).
        IDimensionExpr const& n = *features.d[token_axis(features.nbDims)];
        IDimensionExpr const* opt
            = exprBuilder.operation(DimensionOperation::kMIN, n, *exprBuilder.constant(mConfig.opt_budget));
        IDimensionExpr const* m = exprBuilder.declareSizeTensor(1, *opt, n);
        outputs[0].nbDims = features.nbDims - 1;
        if (features.nbDims == 3)
            outputs[0].d[0] = features.d[0];
        outputs[0].d[outputs[0].nbDims - 1] = m;
        outputs[1].nbDims = 0; // size tensors are 0-D
        return 0;
    }

    bool supportsFormatCombination(
        int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t nbOutputs) noexcept override
    {
        if (nbInputs != kNbInputs || nbOutputs != kNbOutputs || pos < 0 || pos >= kNbInputs + kNbOutputs)
            return false;
        PluginTensorDesc const& desc = inOut[pos].desc;
        DType const features_type = to_core(inOut[kPosFeatures].desc.type);
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
        return workspace_bytes(to_core(inputs[kPosFeatures].max), to_core(inputs[kPosFeatures].desc.type));
    }

    // IPluginV3OneRuntime
    int32_t onShapeChange(PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override
    {
        if (nbInputs != kNbInputs || nbOutputs != kNbOutputs)
            return -1;
        std::string const error = check_input_shapes(
            to_core(in[kPosFeatures].dims), to_core(in[kPosRelevance].dims), to_core(in[kPosBudget].dims),
            to_core(in[kPosTau].dims));
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
        Shape const features = to_core(inputDesc[kPosFeatures].dims);
        int64_t batch = 0, n = 0, d = 0;
        if (!problem_dims(features, &batch, &n, &d))
            return -1;
        DType const type = to_core(inputDesc[kPosFeatures].type);
        int const dtype = type == DType::kFloat16 ? CP_DTYPE_FLOAT16 : CP_DTYPE_FLOAT32;
        size_t const bytes = workspace_bytes(features, type);
        // budget and tau are read on the device, so the enqueue never waits on a host copy; the host
        // values passed here are unused. mCublas was made by attachToContext (outside any graph capture); a
        // plugin without one (not attached) gets the library's handle for this stream.
        int const status = cp_coverage_select(inputs[kPosFeatures], dtype,
            static_cast<float const*>(inputs[kPosRelevance]), batch, n, d, 0,
            static_cast<int64_t const*>(inputs[kPosBudget]), 0.f, static_cast<float const*>(inputs[kPosTau]),
            static_cast<int64_t*>(outputs[0]), static_cast<int32_t*>(outputs[1]), workspace, bytes, stream, mCublas);
        if (status != CP_OK)
        {
            log_error(std::string(cp_status_string(status)) + ": " + cp_last_error());
            return -1;
        }
        return 0;
    }

    // Called once per execution context, when it is created: the place to allocate (the cuBLAS handle), since
    // enqueue may run inside a CUDA-graph capture where allocation is forbidden.
    IPluginV3* attachToContext(IPluginResourceContext* context) noexcept override
    {
        (void) context;
        auto* attached = new (std::nothrow) CoverageSelectorPlugin(mConfig);
        if (attached != nullptr && cp_cublas_create(&attached->mCublas) != CP_OK)
        {
            log_error(std::string("attachToContext: ") + cp_last_error());
            delete attached;
            return nullptr;
        }
        return attached;
    }

    PluginFieldCollection const* getFieldsToSerialize() noexcept override { return &mSerialFields; }

private:
    SelectorConfig mConfig;
    PluginField mSerialField;
    PluginFieldCollection mSerialFields{};
    void* mCublas = nullptr; // cublasHandle_t of the execution context this plugin is attached to
};

class CoverageSelectorCreator final : public IPluginCreatorV3One
{
public:
    CoverageSelectorCreator()
    {
        mFieldNames.emplace_back("opt_budget", nullptr, PluginFieldType::kINT64, 1);
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

// Called by IPluginRegistry::loadLibrary before getCreators (TensorRT requires both symbols).
extern "C" __attribute__((visibility("default"))) void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    std::lock_guard<std::mutex> lock(coverpruner::plugin::g_logger_mutex);
    if (coverpruner::plugin::g_logger_finder == nullptr)
        coverpruner::plugin::g_logger_finder = finder;
}
