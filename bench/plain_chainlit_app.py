"""The plain streaming example from Chainlit's docs, as the baseline of bench/ui_streaming.py. Not the product.

    OPENAI_BASE_URL=http://127.0.0.1:PORT/v1 OPENAI_API_KEY=x chainlit run bench/plain_chainlit_app.py --headless

An ``on_message`` that streams the openai SDK's chunks into ``msg.stream_token``, one call per chunk, then
``msg.send()`` — what the docs show ("Streaming" with OpenAI), against the same server as our app.
"""

import chainlit as cl
from openai import AsyncOpenAI

client = AsyncOpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
MODEL = "fake-qwen"


@cl.on_message
async def on_message(message: cl.Message) -> None:
    msg = cl.Message(content="")
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": message.content}], stream=True
    )
    async for part in stream:
        if part.choices and (token := part.choices[0].delta.content or ""):
            await msg.stream_token(token)
    await msg.send()
