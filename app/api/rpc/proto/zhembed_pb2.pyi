from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_FLOAT: _ClassVar[Encoding]
    ENCODING_INT8: _ClassVar[Encoding]
    ENCODING_UBINARY: _ClassVar[Encoding]
    ENCODING_BINARY: _ClassVar[Encoding]
ENCODING_FLOAT: Encoding
ENCODING_INT8: Encoding
ENCODING_UBINARY: Encoding
ENCODING_BINARY: Encoding

class EmbedOptions(_message.Message):
    __slots__ = ("pooling", "layers", "layer_combine", "layer_weights", "long_text", "truncation_direction", "prompt_name")
    POOLING_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    LAYER_COMBINE_FIELD_NUMBER: _ClassVar[int]
    LAYER_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    LONG_TEXT_FIELD_NUMBER: _ClassVar[int]
    TRUNCATION_DIRECTION_FIELD_NUMBER: _ClassVar[int]
    PROMPT_NAME_FIELD_NUMBER: _ClassVar[int]
    pooling: str
    layers: _containers.RepeatedScalarFieldContainer[int]
    layer_combine: str
    layer_weights: _containers.RepeatedScalarFieldContainer[float]
    long_text: str
    truncation_direction: str
    prompt_name: str
    def __init__(self, pooling: _Optional[str] = ..., layers: _Optional[_Iterable[int]] = ..., layer_combine: _Optional[str] = ..., layer_weights: _Optional[_Iterable[float]] = ..., long_text: _Optional[str] = ..., truncation_direction: _Optional[str] = ..., prompt_name: _Optional[str] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "tokenization_ms", "inference_ms", "total_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZATION_MS_FIELD_NUMBER: _ClassVar[int]
    INFERENCE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    tokenization_ms: float
    inference_ms: float
    total_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., tokenization_ms: _Optional[float] = ..., inference_ms: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("inputs", "options", "normalize", "encoding", "dimensions")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    options: EmbedOptions
    normalize: bool
    encoding: Encoding
    dimensions: int
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., options: _Optional[_Union[EmbedOptions, _Mapping]] = ..., normalize: _Optional[bool] = ..., encoding: _Optional[_Union[Encoding, str]] = ..., dimensions: _Optional[int] = ...) -> None: ...

class Vector(_message.Message):
    __slots__ = ("values", "int8", "scale", "packed")
    VALUES_FIELD_NUMBER: _ClassVar[int]
    INT8_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    PACKED_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    int8: bytes
    scale: float
    packed: bytes
    def __init__(self, values: _Optional[_Iterable[float]] = ..., int8: _Optional[bytes] = ..., scale: _Optional[float] = ..., packed: _Optional[bytes] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("vectors", "timings")
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    vectors: _containers.RepeatedCompositeFieldContainer[Vector]
    timings: Timings
    def __init__(self, vectors: _Optional[_Iterable[_Union[Vector, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class Pair(_message.Message):
    __slots__ = ("a", "b")
    A_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    a: str
    b: str
    def __init__(self, a: _Optional[str] = ..., b: _Optional[str] = ...) -> None: ...

class SimilarityRequest(_message.Message):
    __slots__ = ("source_sentence", "sentences", "pairs", "options")
    SOURCE_SENTENCE_FIELD_NUMBER: _ClassVar[int]
    SENTENCES_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    source_sentence: str
    sentences: _containers.RepeatedScalarFieldContainer[str]
    pairs: _containers.RepeatedCompositeFieldContainer[Pair]
    options: EmbedOptions
    def __init__(self, source_sentence: _Optional[str] = ..., sentences: _Optional[_Iterable[str]] = ..., pairs: _Optional[_Iterable[_Union[Pair, _Mapping]]] = ..., options: _Optional[_Union[EmbedOptions, _Mapping]] = ...) -> None: ...

class SimilarityResponse(_message.Message):
    __slots__ = ("scores", "timings")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    scores: _containers.RepeatedScalarFieldContainer[float]
    timings: Timings
    def __init__(self, scores: _Optional[_Iterable[float]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...

class FillMaskRequest(_message.Message):
    __slots__ = ("inputs", "top_k", "targets")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    top_k: int
    targets: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., top_k: _Optional[int] = ..., targets: _Optional[_Iterable[str]] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("score", "token", "token_str", "sequence")
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_STR_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    score: float
    token: int
    token_str: str
    sequence: str
    def __init__(self, score: _Optional[float] = ..., token: _Optional[int] = ..., token_str: _Optional[str] = ..., sequence: _Optional[str] = ...) -> None: ...

class Mask(_message.Message):
    __slots__ = ("candidates",)
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    def __init__(self, candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ...) -> None: ...

class MaskAnswer(_message.Message):
    __slots__ = ("masks",)
    MASKS_FIELD_NUMBER: _ClassVar[int]
    masks: _containers.RepeatedCompositeFieldContainer[Mask]
    def __init__(self, masks: _Optional[_Iterable[_Union[Mask, _Mapping]]] = ...) -> None: ...

class FillMaskResponse(_message.Message):
    __slots__ = ("answers", "timings")
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[MaskAnswer]
    timings: Timings
    def __init__(self, answers: _Optional[_Iterable[_Union[MaskAnswer, _Mapping]]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ...) -> None: ...
