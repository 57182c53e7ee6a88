"""Token id layout shared by the synthetic sources (grammar, khop, mix)."""

PAD = 0
EOS = 1

# k-hop variable binding.
EQ = 2
SEMI = 3
QUERY = 4
NUM_VARS = 64
VAR0 = 5
NUM_VALUES = 32
VALUE0 = VAR0 + NUM_VARS
KHOP_VOCAB = VALUE0 + NUM_VALUES

# Grammar words occupy [GRAMMAR0, GRAMMAR0 + GRAMMAR_SIZE); roles are seeded.
GRAMMAR0 = KHOP_VOCAB
GRAMMAR_SIZE = 134
GRAMMAR_VOCAB = GRAMMAR0 + GRAMMAR_SIZE
