"""From a caller's arguments to one validated runtime Request (runtime/stages.py), before any work: the options
(runtime.options.GenerationOptions, validated once when built) resolved against the engine dir (the manifest's
tau, the family's request options, the method's own options, the vocabulary), the messages normalised
(runtime/messages.py), the text's size and each video's cost (from its header) checked, the response_format
compiled (runtime/grammar.py). Each refusal is a one-line CoverPrunerError naming its option or message part.
"""

from __future__ import annotations

import dataclasses

from coverpruner.engine_dir import DEFAULT_MAX_IMAGES
from coverpruner.families.contract import ChatFeatures
from coverpruner.runtime.errors import CoverPrunerError, ImageError, OptionError, PromptError, VideoError
from coverpruner.runtime import tool_calls
from coverpruner.runtime.grammar import response_schema
from coverpruner.runtime.messages import Conversation, normalize, one_turn
from coverpruner.runtime.model import Model
from coverpruner.runtime.options import GenerationOptions, check_method_options, check_tau, split_method_options
from coverpruner.runtime.sampling import SamplingConfig
from coverpruner.runtime.stages import Request
from coverpruner.video import DEFAULT_MAX_VIDEO_PIXELS, VideoInput


def _json_schema(schema: dict) -> dict:
    """A tool's parameters as a response_format (compiled alone to check it: runtime.grammar)."""
    return {"type": "json_schema", "json_schema": {"name": "parameters", "schema": schema, "strict": True}}


class RequestBuilder:
    """Builds the Requests of one Model's engine dir."""

    def __init__(self, model: Model):
        self.model = model
        self._options = {o.name: o for o in model.family.request_options}
        #: most decoded pixels (sampled frames x height x width, 3 bytes each) one video may hold, checked from its
        #: header before decoding; None: no bound. The server sets it from --max-video-pixels.
        self.max_video_pixels: int | None = DEFAULT_MAX_VIDEO_PIXELS

    def request(self, image, prompt: str, options: GenerationOptions) -> Request:
        """generate's arguments -> a validated Request: the conversation of one user message [image, prompt].
        OptionError / PromptError (one line) for a bad option, an empty prompt or a prompt that cannot fit the
        context (known from its length, before tokenizing); the image and the tokenized prompt are checked by the
        input stages."""
        model = self.model
        self.check_options(options)
        if not isinstance(prompt, str):
            raise PromptError(f"prompt must be a string, got {type(prompt).__name__}", param="prompt")
        if not prompt.strip():
            raise PromptError("prompt is empty", param="prompt")
        if not model.encoder.fits(prompt, model.max_positions):
            raise PromptError(f"prompt is {len(prompt)} characters, more than fit the context of "
                              f"{model.max_positions} tokens", code="context_length_exceeded", param="prompt")
        return self._request(normalize(one_turn(image, prompt)), options)

    def chat_request(self, messages, options: GenerationOptions, videos: bool = True) -> Request:
        """chat's arguments -> a validated Request. OptionError / PromptError (one line) for a bad option or a
        malformed message (naming messages[i].content[j]); more than max_images images is a PromptError.
        videos=False leaves out the check of each video's cost from its header (the server's check before it has
        fetched the videos)."""
        model = self.model
        limit = model.manifest.defaults.get("max_images", DEFAULT_MAX_IMAGES) if options.max_images is None \
            else options.max_images
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:  # a manifest's own default
            raise OptionError(f"max_images must be an integer >= 0, got {limit!r}", param="max_images")
        resolved = self.check_options(options)
        conversation = normalize(messages, limit)
        text = "".join(p["text"] for m in conversation.messages if isinstance(m.get("content"), list)
                       for p in m["content"] if p["type"] == "text")
        if not model.encoder.fits(text, model.max_positions):  # known from its length, before tokenizing
            raise PromptError(f"messages hold {len(text)} characters of text, more than fit the context of "
                              f"{model.max_positions} tokens", code="context_length_exceeded")
        if videos:
            self._admit_videos(conversation.images, resolved)
        return self._request(conversation, options)

    def _admit_videos(self, inputs, options: dict) -> None:
        """Refuse, from each video file's header alone (FamilyRuntime.video_cost: no frame decoded), a video whose
        decoded frames exceed max_video_pixels (VideoError video_too_large) or whose visual tokens alone exceed
        the context (PromptError context_length_exceeded): both known before the decode and vision work."""
        model, tokens = self.model, 0
        for video in (v for v in inputs if isinstance(v, VideoInput)):
            try:
                cost = model.family_runtime.video_cost(video, options)
            except CoverPrunerError:
                raise
            except ValueError as exc:
                raise ImageError(str(exc).splitlines()[0]) from None
            if cost is None:
                continue
            if self.max_video_pixels is not None and cost.decoded_pixels > self.max_video_pixels:
                raise VideoError(f"{video.where}: {cost.frames} sampled frames of {cost.width}x{cost.height} are "
                                 f"{cost.decoded_pixels} pixels; at most {self.max_video_pixels} per video "
                                 "(max_video_pixels; lower fps or max_frames)", code="video_too_large",
                                 param=video.where)
            tokens += cost.visual_tokens
            if tokens > model.max_positions:
                raise PromptError(f"{video.where}: {cost.frames} frames of {cost.width}x{cost.height} give "
                                  f"{cost.visual_tokens} visual tokens; the videos hold {tokens}, more than fit the "
                                  f"context of {model.max_positions} tokens", code="context_length_exceeded",
                                  param=video.where)

    def check_options(self, options: GenerationOptions) -> dict:
        """What of the options the engine dir and the method decide, before any other work: the family's request
        options resolved, and the selection method's own options (its registry declaration: dart's pivots,
        cdpruner's relevance_weight), which ride among the keyword options -> {name: value} of both."""
        family, given = split_method_options(options.family)
        return {**self.resolve_options(family), **check_method_options(options.method, given)}

    def _request(self, conversation, opts: GenerationOptions) -> Request:
        """The Request of a normalised conversation under checked options (the manifest's tau default, the
        family's options resolved, EOS ids unless ignore_eos, token ids within the vocabulary, the tools and chat
        template variables the template takes, the answer's grammar)."""
        model = self.model
        tau = check_tau(model.manifest.defaults.get("tau", 0.3)) if opts.tau is None else opts.tau
        self._in_vocabulary("stop_token_ids", opts.stop_token_ids)
        self._in_vocabulary("logit_bias", opts.logit_bias)
        sampling = SamplingConfig(opts.temperature, opts.top_p, opts.seed, opts.frequency_penalty,
                                  opts.presence_penalty, opts.logit_bias)
        features = getattr(model.family_runtime, "chat_features", None) or ChatFeatures()
        conversation = self._chat(conversation, opts, features)
        tool_plan = tool_calls.plan(opts.tools, opts.tool_choice, opts.parallel_tool_calls, features,
                                    opts.response_format)
        opens = getattr(model.family_runtime, "opens_reasoning", None)
        reasoning = features.reasoning if features.reasoning is not None and opens is not None and opens(
            conversation.messages, list(conversation.tools), conversation.template_kwargs) else None
        return Request(conversation, opts.budget, opts.method, tau, opts.max_new_tokens, sampling,
                       frozenset() if opts.ignore_eos else frozenset(model.eos_ids), self.check_options(opts),
                       opts.demand, self._grammar(opts.response_format, tool_plan, reasoning), opts.stop,
                       frozenset(opts.stop_token_ids), opts.n, opts.logprob_count, tool_plan, reasoning)

    def _chat(self, conversation: Conversation, opts: GenerationOptions, features: ChatFeatures) -> Conversation:
        """The conversation with the tools and template variables its chat template renders: OptionError for a
        variable the template does not read (chat_template_kwargs.<name>), PromptError for a tool round trip in
        the history of a template that renders no tools."""
        unknown = sorted(set(opts.chat_template_kwargs) - set(features.variables))
        if unknown:
            raise OptionError(f"chat_template_kwargs.{unknown[0]}: this model's chat template does not read it (it "
                              f"reads {sorted(features.variables) or 'no variables'})",
                              param=f"chat_template_kwargs.{unknown[0]}")
        if features.tool_calls is None:
            for i, m in enumerate(conversation.messages):
                if m["role"] == "tool" or m.get("tool_calls"):
                    raise PromptError(f"messages[{i}]: this model's chat template renders no tool calls or tool "
                                      "results, so a tool round trip cannot be in its conversation",
                                      param=f"messages[{i}]")
            return dataclasses.replace(conversation, template_kwargs=dict(opts.chat_template_kwargs))
        return dataclasses.replace(conversation, tools=tuple(opts.tools),
                                   template_kwargs=dict(opts.chat_template_kwargs))

    def _grammar(self, response_format, tool_plan, reasoning):
        """The answer's checked Grammar (runtime/grammar.py) or None: the tool plan's calls (a lark grammar over the
        family's format; each reached tool's schema checked and compiled on its own first, so a bad one is refused
        naming it), else the response_format, after the reasoning when the prompt opened it."""
        compiler = self.model.grammars
        if tool_plan is not None:
            for tool in tool_plan.tools:
                compiler.compile(_json_schema(tool.parameters), param=f"{tool.param}.parameters")
            for text, param, what in tool_calls.literals(tool_plan):
                compiler.check_spelling([(text, what)], param)
            return compiler.compile_lark(tool_calls.grammar(tool_plan, reasoning, compiler.literal), param="tools")
        grammar = compiler.compile(response_format)
        if grammar is None or reasoning is None:
            return grammar
        return compiler.compile_lark(tool_calls.grammar(None, reasoning, compiler.literal,
                                                        response_schema(response_format)), param="response_format")

    def _in_vocabulary(self, name: str, ids) -> None:
        """OptionError (param ``name``) for a token id past the vocabulary."""
        past = [t for t in ids if t >= self.model.vocab_size]
        if past:
            raise OptionError(f"{name} token id {past[0]} is past the vocabulary (ids 0..{self.model.vocab_size - 1})",
                              param=name)

    def resolve_options(self, given: dict) -> dict:
        """Family request options: given values (validated) over the manifest's defaults over the family's.
        OptionError (one line) for an option the family does not have or a value it does not allow."""
        unknown = sorted(set(given) - set(self._options))
        if unknown:
            raise OptionError(f"unknown option(s) {unknown} for model family {self.model.manifest.family!r}; it takes "
                              f"{sorted(self._options) or 'none'}", param=unknown[0])
        resolved = {}
        for name, opt in self._options.items():
            value = given.get(name)
            if value is None:
                value = self.model.manifest.options.get(name, opt.default)
            try:
                resolved[name] = opt.validate(value)
            except ValueError as exc:
                raise OptionError(str(exc).splitlines()[0], param=name) from None
        return resolved
