"""Prompts of an exact length from the default corpus: reading only what is needed changes nothing."""

import pytest

from oneknob.provision import corpus


@pytest.mark.parametrize("samples,sample_tokens", [(2, 2048), (5, 4096), (40, 512)])
def test_samples_equal_those_cut_from_the_whole_text(samples, sample_tokens):
    tokenizer = corpus.ByteTokenizer()
    whole = tokenizer.encode(corpus.stdlib_text())
    loaded = corpus.load_corpus(None, tokenizer, sample_tokens, samples)
    assert [list(s) for s in loaded.samples] == [whole[i * sample_tokens:(i + 1) * sample_tokens]
                                                 for i in range(samples)]
    assert loaded.prompt(300, 1) == whole[sample_tokens:sample_tokens + 300]


def test_too_few_tokens_names_samples_and_the_fix():
    with pytest.raises(corpus.CorpusError, match=r"samples=100000: the corpus \(python-stdlib\) has \d+ tokens"):
        corpus.load_corpus(None, corpus.BYTES, 4096, 100_000)
