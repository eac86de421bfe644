"""From chat messages and text to the token ids a serving engine prefills: chat templates,
tokenizers, the compiled word path of cl100k, and bulk tokenization piece by piece."""
