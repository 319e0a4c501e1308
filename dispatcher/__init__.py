"""Manager-side dispatcher: claims MultiKueue TrainJobs, places them on worker clusters,
mirrors them there and syncs their status back."""
