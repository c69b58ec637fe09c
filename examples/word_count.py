"""Word and bigram counts over a generated corpus: lots of allocation, little kept.

A deterministic corpus of about a million words is generated, split into
sentences and words, and counted (words and word pairs). Almost everything
allocated is a short-lived string, list or tuple.

    mprof record -o words.mprof -- python3 examples/word_count.py
    mprof report words.mprof --view allocated --by function
    mprof flamegraph words.mprof -o words.svg

What the profile should show: about 290 MiB allocated in total, led by
`make_corpus` (sentence strings and the corpus) and `tokenize` (the word
lists), then `Counter.update` in the standard library, where the bigram
tuples are made; the peak view, about 80 MiB, is some 90% `tokenize`: the word
lists of every sentence are alive at once; the live view at the end is down
to a few MiB of interpreter start-up, since everything was dropped.

Runs in about a second; Python 3.8+, standard library only.
"""

import collections
import random

VOCABULARY = (
    "the of and to in is was he for it with as his on be at by had are but from or have an they which one "
    "you were her all she there would their we him been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now such like "
    "memory profile sample heap stack frame thread python allocation leak cache page buffer object"
).split()


def make_corpus(words, seed=7):
    rng = random.Random(seed)
    sentences = []
    for _ in range(words // 12):
        sentence = " ".join(rng.choices(VOCABULARY, k=rng.randint(6, 18)))
        sentences.append(sentence.capitalize() + ".")
    return " ".join(sentences)


def tokenize(text):
    """Sentences as lists of lower-case words."""
    sentences = []  # a loop, not a comprehension: before 3.12 that would be a frame of its own
    for sentence in text.split("."):
        words = sentence.lower().split()
        if words:
            sentences.append(words)
    return sentences


def count_words(sentences):
    counts = collections.Counter()
    for words in sentences:
        counts.update(words)
    return counts


def count_bigrams(sentences):
    counts = collections.Counter()
    for words in sentences:
        counts.update(zip(words, words[1:]))
    return counts


def main():
    text = make_corpus(1000000)
    sentences = tokenize(text)
    del text
    words = count_words(sentences)
    bigrams = count_bigrams(sentences)
    del sentences
    print("%d words, %d distinct, %d distinct bigrams" % (sum(words.values()), len(words), len(bigrams)))
    for (first, second), n in bigrams.most_common(3):
        print("  %-12s %-12s %d" % (first, second, n))


if __name__ == "__main__":
    main()
