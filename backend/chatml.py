"""ChatML: the fallback chat template and its special tokens.

Shared by the launcher (vLLM's ``--chat-template`` when a model folder has none) and the chat
side (rendering and counting with the same template).
"""

#: The built-in fallback, used only when a tokenizer folder has no chat template. Qwen's and
#: SmolLM2's own templates render plain role/content messages exactly like this.
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHATML_SPECIALS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>")
