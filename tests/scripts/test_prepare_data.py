"""scripts/prepare_data.py on a tiny offline tokenizer: the loss mask covers exactly the assistant
turns (their words and the <|im_end|> closing them), for ShareGPT and OpenAI-style input."""
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "prepare_data.py"
SPECIAL = ["<unk>", "<|im_start|>", "<|im_end|>"]
WORDS = ["system", "user", "assistant", "be", "brief", "hi", "there", "hello", "how", "are",
         "you", "fine", "thanks", "bye", "ok", "think", "<", ">", "/"]
# Qwen-like: every turn is <|im_start|>role\ncontent<|im_end|>\n.
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def save_tokenizer(directory):
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>",
                                        eos_token="<|im_end|>",
                                        additional_special_tokens=["<|im_start|>"])
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(directory)
    return vocab


class PrepareData(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        self.vocab = save_tokenizer(self.dir / "target")

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, rows, *extra):
        source = self.dir / "chat.jsonl"
        source.write_text("".join(json.dumps(row) + "\n" for row in rows))
        out = self.dir / "tokens.jsonl"
        result = subprocess.run([sys.executable, str(SCRIPT), "--target", str(self.dir / "target"),
                                 "--input", str(source), "--out", str(out), *extra],
                                capture_output=True, text=True)
        return result, ([json.loads(l) for l in out.read_text().splitlines()] if out.exists() else [])

    def tokens(self, words):
        return [self.vocab[w] for w in words.split()]

    def test_sharegpt_masks_exactly_the_assistant_turns(self):
        result, samples = self.run_script([{"conversations": [
            {"from": "system", "value": "be brief"},
            {"from": "human", "value": "hi there"},
            {"from": "gpt", "value": "hello how are you"},
            {"from": "human", "value": "fine thanks"},
            {"from": "gpt", "value": "ok bye"}]}])
        self.assertEqual(result.returncode, 0, result.stderr)
        [sample] = samples
        # (words, supervised) in order; newlines are not tokens of this tokenizer.
        expected = [("<|im_start|> system be brief <|im_end|>", 0),
                    ("<|im_start|> user hi there <|im_end|>", 0),
                    ("<|im_start|> assistant", 0), ("hello how are you <|im_end|>", 1),
                    ("<|im_start|> user fine thanks <|im_end|>", 0),
                    ("<|im_start|> assistant", 0), ("ok bye <|im_end|>", 1)]
        ids = [t for words, _ in expected for t in self.tokens(words)]
        mask = [m for words, m in expected for _ in words.split()]
        self.assertEqual(sample["input_ids"], ids)
        self.assertEqual(sample["loss_mask"], mask)

    def test_openai_style_and_leading_assistant_turn_dropped(self):
        result, samples = self.run_script([
            {"messages": [{"role": "assistant", "content": "ok"},
                          {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "hello"}]},
            {"messages": [{"role": "user", "content": "hi"}]}])  # no assistant turn: skipped
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("skipped 1", result.stdout)
        [sample] = samples
        self.assertEqual(sample["input_ids"],
                         self.tokens("<|im_start|> user hi <|im_end|> <|im_start|> assistant "
                                     "hello <|im_end|>"))
        self.assertEqual(sample["loss_mask"], [0, 0, 0, 0, 0, 0, 1, 1])

    def test_max_length_cuts_and_bad_rows_name_the_line(self):
        row = {"messages": [{"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "hello"}]}
        result, samples = self.run_script([row], "--max-length", "5")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(len(samples[0]["input_ids"]), 5)
        self.assertEqual(samples[0]["loss_mask"], [0] * 5)
        result, _ = self.run_script([row, {"messages": [{"role": "robot", "content": "x"}]}])
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("chat.jsonl:2", result.stderr)
        self.assertIn("'role'", result.stderr)


if __name__ == "__main__":
    unittest.main()
