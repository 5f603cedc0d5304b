"""What the report claims: the comparisons and their Holm families (`comparisons`), and which test is primary, the
one that may carry a `*` (`primary`: the primary measure, a sweep's primary trend, the adaptive stop's decision)."""
