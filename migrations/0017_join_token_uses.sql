-- A join token admits as many machines as it was minted for (one by default), counted down
-- inside the join's own transaction (store/join_tokens.rs `use_one`), so two joins racing for
-- its last use cannot both have it.
ALTER TABLE join_tokens ADD COLUMN uses_left integer NOT NULL DEFAULT 1
    CONSTRAINT join_tokens_uses_left_check CHECK (uses_left >= 0);
