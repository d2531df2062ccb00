"""`gspo plot`'s figures: `plot` (building and saving them), `catalog` (which figures exist),
`axes` (the honest-axes helpers every figure uses), `curves` (the seed means and bands drawn), and
one module per figure kind: `differences`, `fit`, `survival`. May import `rundata`, `stats` and
`tables`; never `report`. matplotlib is imported here and nowhere below.
"""
