"""What the retrieval stacks' APIs ask beyond TEI's routes: Cohere's embed (``input_type`` as the model's
prompts), Jina's and Cohere's rerank (``max_tokens_per_doc``), and TEI's ``/decode``. Each stands on the
tasks TEI's routes use, so its vectors and scores are ``/embed``'s and ``/rerank``'s."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np

from app.errors import EmptyInput, ValidationFailed
from app.tasks.answers import Answer, timed
from app.tasks.core import Core, Task
from app.tasks.embeddings import Embeddings
from app.tasks.heads import Heads
from app.tasks.options import Direction, EmbedOptions, LongText, Names, listed
from app.tasks.prepare import check_count, check_some
from app.tasks.token_ids import out_of_vocabulary

# Cohere's input types, and the names of a model's prompts (its sentence-transformers config) each takes,
# the first the model has; an input type the model has no prompt for embeds the text alone.
INPUT_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
# What a Cohere embed of a text over the model's length with truncate NONE is told.
TOO_LONG_COHERE = "send truncate END to keep its start, or START to keep its end"


def input_prompt(input_type: str | None, prompts: dict[str, str], default: str | None) -> str | None:
    """The prompt name Cohere's ``input_type`` embeds with (none given: the model's default prompt)."""
    if input_type is None:
        return default
    names = INPUT_PROMPTS.get(input_type)
    if names is None:
        raise ValidationFailed(
            f"input_type {input_type!r} is not supported: this model embeds text; send one of "
            + ", ".join(INPUT_PROMPTS)
        )
    return next((name for name in names if name in prompts), None)


class Retrieval(Task):
    def __init__(self, core: Core, embeddings: Embeddings, heads: Heads) -> None:
        super().__init__(core)
        self.embeddings = embeddings
        self.heads = heads

    @timed
    async def embed(
        self,
        texts: list[str],
        input_type: str | None,
        long_text: LongText,
        direction: Direction,
        dimensions: int | None,
    ) -> Answer[tuple[np.ndarray, int]]:
        """Cohere's embed: each text's vector (with the input type's prompt) and the tokens of them all."""
        defaults = self.core.defaults
        prompt = input_prompt(input_type, self.core.model.manifest.defaults.prompts, defaults.prompt_name)
        options: EmbedOptions = replace(
            defaults,
            prompt_name=prompt,
            long_text=long_text,
            truncation_direction=direction,
            dimensions=dimensions,
        )
        names = listed("texts", texts)
        got = await self.embeddings.vectors(self.core.texts(texts, names), options, names, TOO_LONG_COHERE)
        return Answer((got.vectors, int(got.tokens.sum())), got.timings)

    @timed
    async def rerank(
        self,
        query: str,
        documents: list[str],
        max_tokens_per_doc: int | None,
        long_text: LongText,
        direction: Direction,
    ) -> Answer[tuple[list[dict[str, object]], int]]:
        """Jina's and Cohere's rerank: ``/rerank``'s ranks of the documents cut to ``max_tokens_per_doc``,
        and the tokens the pairs ran with (tokenised once more for the cut and the count)."""
        self.core.head("/rerank", "reranker")
        check_some(len(documents), "documents", "document to rank")
        self.core.texts([query], Names("query", lambda _i: "query"))
        self.core.texts(documents, listed("documents", documents))
        with self.core.engine.admit(len(documents)):
            encodings, tokenization_ms = await self.core.engine.tokenize(
                [query, *documents], add_special_tokens=False, offsets=max_tokens_per_doc is not None
            )
        kept = list(documents)
        lengths = [len(e.ids) for e in encodings[1:]]
        if max_tokens_per_doc is not None:
            for i, enc in enumerate(encodings[1:]):
                if lengths[i] > max_tokens_per_doc:
                    kept[i] = documents[i][: enc.offsets[max_tokens_per_doc - 1][1]]
                    lengths[i] = max_tokens_per_doc
        limit = self.core.model.tokenizer.max_length
        query_tokens = len(encodings[0].ids)
        tokens = int(np.minimum(np.asarray(lengths) + query_tokens + 3, limit).sum())
        answer = await self.heads.rerank(query, kept, False, False, long_text, direction)
        answer.timings.tokenization_ms += tokenization_ms
        return Answer((answer.value, tokens), answer.timings)

    @timed
    async def decode(self, id_lists: list[list[int]], skip_special_tokens: bool) -> Answer[list[str]]:
        """TEI's decode: each list of token ids as text, on a worker thread (a long list takes milliseconds),
        with a permit per list, as ``/tokenize`` takes one per text. Bounded as ``/tokenize`` is: at most
        ``max_input_chars`` + 2 ids a list ([CLS] and [SEP]), ``max_tokenize_tokens`` in all."""
        self.core.check_ready()
        settings = self.core.settings
        names = Names("ids", lambda i: f"ids[{i}]")
        if not id_lists:
            raise EmptyInput("ids is empty: send a list of token ids, or a list of such lists")
        check_count(len(id_lists), settings.max_inputs_per_request, names)
        most = settings.max_input_chars + 2
        vocab = self.core.model.manifest.config.vocab_size
        for i, ids in enumerate(id_lists):
            if len(ids) > most:
                raise ValidationFailed(
                    f"{names.item(i)} has {len(ids)} ids, over the {most} this server decodes in one list "
                    "(max_input_chars + 2): split it"
                )
            if (problem := out_of_vocabulary(ids, vocab, names.item, i)) is not None:
                raise problem
        if (total := sum(map(len, id_lists))) > settings.max_tokenize_tokens:
            raise ValidationFailed(
                f"{total} ids in one request; the limit is {settings.max_tokenize_tokens} "
                "(ZHEMBED_MAX_TOKENIZE_TOKENS, as /tokenize answers at most): decode them in several requests"
            )
        tokenizer = self.core.model.tokenizer
        with self.core.engine.admit(len(id_lists)):
            texts = await asyncio.to_thread(
                lambda: [tokenizer.decode(ids, skip_special_tokens=skip_special_tokens) for ids in id_lists]
            )
        return Answer(texts)
