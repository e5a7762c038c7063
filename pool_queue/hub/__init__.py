"""The Hugging Face hub: downloading the items, frame shards and models (`fetch`), packing a results root
for its return (`pack`) and uploading it (`upload`)."""
